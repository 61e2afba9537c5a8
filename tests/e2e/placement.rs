//! Where rank 0 and `MASTER_ADDR` are: Slurm's task 0 on another node than
//! the step's first (`-m arbitrary`, 26.05's topology order, read through
//! srun's plugin and the step's layout, one RPC), and `master_addr=hostname|addr`
//! from the slurm.conf slurmd read.

use slurm_lab::Lab;

use crate::{CaseResult, ok};

/// Runs `srun ARGS` with every task printing `SLURM_PROCID RANK NODE_RANK
/// MASTER_ADDR host`, then the rendezvous stand-in with the same layout.
/// Checks that `MASTER_ADDR`, `NODE_RANK` 0, `RANK` 0 and Slurm's task 0 are
/// one host (srun's plugin told the step where task 0 is), that `RANK` is
/// `SLURM_PROCID`, and that the ranks meet there; returns the host of
/// `SLURM_PROCID` 0 (which order Slurm used).
fn rank_0_is_on_master_addr(lab: &Lab, env: &[(&str, &str)], args: &[&str]) -> Result<String, String> {
    let show = "echo \"$SLURM_PROCID $RANK $NODE_RANK $MASTER_ADDR $(hostname)\"";
    let mut cmd = lab.command("srun");
    cmd.envs(env.iter().copied()).args(args).args(["--auto-rdzv=verbose", "/bin/bash", "-c", show]);
    let (so, se) = ok(&mut cmd)?;
    let rows: Vec<Vec<&str>> = so.lines().map(|l| l.split_whitespace().collect()).collect();
    ensure!(rows.len() == 2 && rows.iter().all(|r| r.len() == 5), "{args:?}:\n{so}\n{se}");
    let on = |col: usize, val: &str| rows.iter().find(|r| r[col] == val).map(|r| r[4].to_owned());
    let (rank0, node0, procid0) = (on(1, "0"), on(2, "0"), on(0, "0"));
    let master = rows[0][3].to_owned();
    ensure!(
        rank0.as_deref() == Some(master.as_str()) && node0.as_deref() == Some(master.as_str()),
        "{args:?}: MASTER_ADDR={master}, RANK 0 on {rank0:?}, NODE_RANK 0 on {node0:?}:\n{so}"
    );
    ensure!(rows.iter().all(|r| r[0] == r[1]), "{args:?}: RANK is not SLURM_PROCID:\n{so}");
    let procid0 = procid0.ok_or(format!("no SLURM_PROCID 0:\n{so}"))?;
    ensure!(procid0 == master, "{args:?}: Slurm's task 0 on {procid0}, MASTER_ADDR {master}:\n{so}");
    if procid0 != "node1" {
        // Not the step's first node: verbose says why.
        ensure!(
            se.contains(&format!("MASTER_ADDR={master} (node of Slurm's task 0")),
            "{args:?}: verbose does not say MASTER_ADDR is task 0's node:\n{se}"
        );
    }
    let mut cmd = lab.command("srun");
    cmd.envs(env.iter().copied()).args(args).args(["--auto-rdzv", &crate::probe(), "ranks"]);
    let (so, se) = ok(&mut cmd)?;
    let other = if master == "node1" { "node2" } else { "node1" };
    ensure!(
        so.contains(&format!("rank 0 on {master} met [1 {other}] at {master}:")),
        "{args:?}: the ranks did not meet at MASTER_ADDR {master}:\n{so}\n{se}"
    );
    Ok(procid0)
}

/// How many `REQUEST_STEP_LAYOUT` RPCs slurmctld has served (`sdiag`'s
/// statistics by message type; a type not yet seen is not listed).
fn step_layout_rpcs(lab: &Lab) -> Result<u64, String> {
    let (so, _) = ok(lab.command("sdiag").arg("--all"))?;
    let line = so.lines().find(|l| l.trim_start().starts_with("REQUEST_STEP_LAYOUT "));
    let Some(line) = line else { return Ok(0) };
    let count = line.split_once("count:").and_then(|(_, rest)| rest.split_whitespace().next());
    count.and_then(|c| c.parse().ok()).ok_or(format!("sdiag: no count in '{line}'"))
}

/// `-m arbitrary` with `SLURM_HOSTFILE` listing node2 first (every release):
/// Slurm's task 0 is on node2, the node list's first host is node1. srun's
/// plugin tells the step: RANK 0, NODE_RANK 0 and MASTER_ADDR are node2, and
/// the ranks meet there. It asked slurmctld for the layout; five
/// default-layout multi-node steps with `--auto-rdzv` did not (`sdiag`).
pub fn arbitrary_layout_puts_rank_0_on_master_addr(lab: &mut Lab) -> CaseResult {
    let before = step_layout_rpcs(lab)?;
    for _ in 0..5 {
        ok(lab.command("srun").args(["-N2", "--ntasks-per-node=1", "--auto-rdzv", "true"]))?;
    }
    let default_rpcs = step_layout_rpcs(lab)? - before;
    println!("(REQUEST_STEP_LAYOUT for 5 default-layout steps: {default_rpcs})");
    ensure!(default_rpcs == 0, "5 default-layout sruns sent {default_rpcs} REQUEST_STEP_LAYOUT to slurmctld");
    let hostfile = lab.dir.join("out/hostfile-node2-first");
    std::fs::write(&hostfile, "node2\nnode1\n").map_err(|e| e.to_string())?;
    let hostfile = hostfile.display().to_string();
    let before = step_layout_rpcs(lab)?;
    ok(lab.command("srun").env("SLURM_HOSTFILE", &hostfile).args([
        "-n2",
        "-m",
        "arbitrary",
        "--auto-rdzv",
        "true",
    ]))?;
    let arbitrary_rpcs = step_layout_rpcs(lab)? - before;
    ensure!(arbitrary_rpcs == 1, "an -m arbitrary srun sent {arbitrary_rpcs} REQUEST_STEP_LAYOUT, not 1");
    let procid0 =
        rank_0_is_on_master_addr(lab, &[("SLURM_HOSTFILE", &hostfile)], &["-n2", "-m", "arbitrary"])?;
    ensure!(procid0 == "node2", "Slurm put SLURM_PROCID 0 on {procid0}, not the hostfile's first line");
    // srun's word reaches the step through --export=NONE too (a SLURM_ name).
    let args = ["-n2", "-m", "arbitrary", "--export=NONE"];
    let procid0 = rank_0_is_on_master_addr(lab, &[("SLURM_HOSTFILE", &hostfile)], &args)?;
    ensure!(procid0 == "node2", "--export=NONE: Slurm put SLURM_PROCID 0 on {procid0}");
    // `spank-gpu explain` gives the same MASTER_ADDR, for the same reason, as the plugin.
    let explain = slurm_lab::agents::bin("spank-gpu").display().to_string();
    let dir = lab.dir.join("out/explain-arbitrary");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (o, e) = (format!("{}/%t.json", dir.display()), format!("{}/%t.err", dir.display()));
    ok(lab.command("srun").env("SLURM_HOSTFILE", &hostfile).args([
        "-n2",
        "-m",
        "arbitrary",
        "--auto-rdzv=verbose",
        "-o",
        &o,
        "-e",
        &e,
        &explain,
        "explain",
        "--json",
    ]))?;
    for t in 0..2 {
        let json = std::fs::read_to_string(dir.join(format!("{t}.json"))).map_err(|e| e.to_string())?;
        let err = std::fs::read_to_string(dir.join(format!("{t}.err"))).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&json).map_err(|e| format!("{e}: {json}"))?;
        let addr = v["vars"].as_array().into_iter().flatten().find(|x| x["name"] == "MASTER_ADDR");
        let (value, why) = addr.map_or((None, None), |r| (r["value"].as_str(), r["why"].as_str()));
        let want = match (value, why) {
            (Some(val @ "node2"), Some(why)) if why.contains("task 0") => {
                format!(" MASTER_ADDR={val} ({why})")
            }
            _ => return Err(format!("task {t}: explain does not put MASTER_ADDR on task 0's node2: {json}")),
        };
        ensure!(err.contains(&want), "task {t}: the plugin's line lacks '{want}':\n{err}");
    }
    // The default block layout: nothing changes.
    let procid0 = rank_0_is_on_master_addr(lab, &[], &["-N2", "--ntasks-per-node=1"])?;
    ensure!(procid0 == "node1", "block layout: SLURM_PROCID 0 on {procid0}");
    Ok(())
}

/// On a lab with [`reversed_topology`]: `srun -N2 --ntasks-per-node=1`.
/// 26.05 numbers tasks in topology order (task 0 on node2), earlier releases
/// in node order; on every release RANK 0, NODE_RANK 0, MASTER_ADDR and
/// Slurm's task 0 are one host and the ranks meet there. Prints which order
/// Slurm used.
pub fn topology_order_puts_rank_0_on_master_addr(lab: &mut Lab) -> CaseResult {
    let procid0 = rank_0_is_on_master_addr(lab, &[], &["-N2", "--ntasks-per-node=1"])?;
    println!("(Slurm's SLURM_PROCID 0 on {procid0})");
    // The lab shows the layout it is for: 26.05 hands out task ids in topology order
    // (src/common/slurm_step_layout.c `_task_layout_topo`), earlier releases in node order.
    let expected = if lab.slurm_at_least(26, 5) { "node2" } else { "node1" };
    ensure!(procid0 == expected, "Slurm {} put SLURM_PROCID 0 on {procid0}, not {expected}", lab.release());
    Ok(())
}

/// `master_addr=addr`: `MASTER_ADDR` is the first node's NodeAddr from
/// slurm.conf on every node (where NodeName does not resolve), and a
/// slurm.conf the plugin cannot read leaves the NodeName with one log line.
pub fn master_addr_word_gives_the_first_nodes_addr(lab: &mut Lab) -> CaseResult {
    let conf = format!("slurm_conf={}", lab.slurm_conf().display());
    let result = (|| {
        lab.set_plugstack_args(&["master_addr=addr", &conf]).map_err(|e| e.to_string())?;
        let (so, _) = ok(lab.command("srun").args(["--auto-rdzv", "-N2", "-n2", "printenv", "MASTER_ADDR"]))?;
        let got: Vec<&str> = so.lines().collect();
        ensure!(got == ["10.77.0.11", "10.77.0.11"], "MASTER_ADDR with master_addr=addr: {got:?}");
        let (so, _) =
            ok(lab.command("srun").args(["--auto-rdzv", "-N2", "-n2", "printenv", "PET_MASTER_ADDR"]))?;
        ensure!(so.lines().all(|l| l == "10.77.0.11"), "PET_MASTER_ADDR: {so}");

        let mark = crate::LogMark::new(lab);
        lab.set_plugstack_args(&["master_addr=addr", "slurm_conf=/nonexistent/slurm.conf"])
            .map_err(|e| e.to_string())?;
        // On node1 by name: which node a one-node step gets is the scheduler's choice.
        let (so, _) = ok(lab.command("srun").args([
            "--auto-rdzv",
            "-w",
            "node1",
            "-N1",
            "-n1",
            "printenv",
            "MASTER_ADDR",
        ]))?;
        ensure!(so.trim() == "node1", "MASTER_ADDR without a readable slurm.conf: {so}");
        let line = mark.wait_for("master_addr=addr: /nonexistent").unwrap_or_default();
        ensure!(line.contains("MASTER_ADDR stays node1"), "no log line saying why: '{line}'");
        Ok(())
    })();
    let reset = lab.set_plugstack_args(&[]).map_err(|e| e.to_string());
    result.and(reset)
}

/// `master_addr=addr` without `slurm_conf=`: the plugin reads the slurm.conf
/// slurmd itself read (slurmd's `SLURM_CONF`, which a configless slurmd
/// points at its conf-cache copy), here the lab's, not `/etc/slurm`.
pub fn master_addr_reads_the_slurm_conf_slurmd_read(lab: &mut Lab) -> CaseResult {
    let result = (|| {
        lab.set_plugstack_args(&["master_addr=addr"]).map_err(|e| e.to_string())?;
        let (so, _) = ok(lab.command("srun").args(["--auto-rdzv", "-N2", "-n2", "printenv", "MASTER_ADDR"]))?;
        let got: Vec<&str> = so.lines().collect();
        ensure!(got == ["10.77.0.11", "10.77.0.11"], "MASTER_ADDR with master_addr=addr alone: {got:?}");
        Ok(())
    })();
    let reset = lab.set_plugstack_args(&[]).map_err(|e| e.to_string());
    result.and(reset)
}
