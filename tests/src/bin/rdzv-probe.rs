//! `rdzv-probe`: a stand-in for a distributed training job, used by the
//! end-to-end tests. It reads only what a real launcher reads, with no glue.
//!
//! ```text
//! rdzv-probe ranks [HOLD_MS]   one task per rank (srun python train.py): MASTER_ADDR, MASTER_PORT,
//!                              RANK, WORLD_SIZE. Rank 0 listens; every other rank connects and sends
//!                              its rank; rank 0 prints the ranks it met. HOLD_MS keeps the listener
//!                              open after the meeting (to overlap two jobs).
//! rdzv-probe torchrun          one task per node, reading PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR,
//!                              PET_MASTER_PORT the way torchrun reads its flags' defaults
//! rdzv-probe hold PORT MS      listen on PORT for MS milliseconds
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::thread::sleep;
use std::time::{Duration, Instant};

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

fn num(name: &str) -> Result<u32, String> {
    var(name)?.parse().map_err(|_| format!("{name} is not a number"))
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_owned()
}

/// Rank 0 of `world`: accept `world - 1` peers, each sending "ID HOST".
fn serve(port: u16, world: u32, hold: Duration) -> Result<Vec<String>, String> {
    let listener = TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("bind {port}: {e}"))?;
    let mut met = Vec::new();
    for _ in 1..world {
        let (mut stream, _) = listener.accept().map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).map_err(|e| e.to_string())?;
        stream.write_all(b"ok\n").map_err(|e| e.to_string())?;
        met.push(line.trim().to_owned());
    }
    met.sort();
    sleep(hold);
    Ok(met)
}

/// Any other rank: connect (retrying while rank 0 starts) and say who we are.
fn join(addr: &str, port: u16, id: u32) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect((addr, port)) {
            Ok(mut stream) => {
                stream.write_all(format!("{id} {}\n", host()).as_bytes()).map_err(|e| e.to_string())?;
                let mut ack = String::new();
                BufReader::new(&stream).read_line(&mut ack).map_err(|e| e.to_string())?;
                return if ack.trim() == "ok" { Ok(()) } else { Err(format!("bad ack '{ack}'")) };
            }
            Err(e) if Instant::now() > deadline => return Err(format!("connect {addr}:{port}: {e}")),
            Err(_) => sleep(Duration::from_millis(50)),
        }
    }
}

fn meet(kind: &str, addr: &str, port: u16, id: u32, world: u32, hold: Duration) -> Result<(), String> {
    if id == 0 {
        let met = serve(port, world, hold)?;
        println!("{kind} 0 on {} met [{}] at {addr}:{port}", host(), met.join(", "));
    } else {
        join(addr, port, id)?;
        println!("{kind} {id} on {} met {kind} 0 at {addr}:{port}", host());
    }
    Ok(())
}

fn run(args: &[String]) -> Result<(), String> {
    let port = |name: &str| -> Result<u16, String> {
        var(name)?.parse().map_err(|_| format!("{name} is not a port"))
    };
    match args.first().map(String::as_str) {
        Some("ranks") => {
            let hold = Duration::from_millis(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0));
            meet("rank", &var("MASTER_ADDR")?, port("MASTER_PORT")?, num("RANK")?, num("WORLD_SIZE")?, hold)
        }
        Some("torchrun") => meet(
            "node",
            &var("PET_MASTER_ADDR")?,
            port("PET_MASTER_PORT")?,
            num("PET_NODE_RANK")?,
            num("PET_NNODES")?,
            Duration::ZERO,
        ),
        Some("hold") => {
            let p: u16 = args.get(1).and_then(|s| s.parse().ok()).ok_or("hold PORT MS")?;
            let ms: u64 = args.get(2).and_then(|s| s.parse().ok()).ok_or("hold PORT MS")?;
            let _l = TcpListener::bind(("0.0.0.0", p)).map_err(|e| format!("bind {p}: {e}"))?;
            println!("holding {p}");
            sleep(Duration::from_millis(ms));
            Ok(())
        }
        _ => Err("usage: rdzv-probe ranks [HOLD_MS] | torchrun | hold PORT MS".to_owned()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdzv-probe: {e}");
            ExitCode::FAILURE
        }
    }
}
