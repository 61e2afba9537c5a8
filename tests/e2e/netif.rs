//! NCCL and gloo on the fabric the site names (issue 30): the lab's nodes
//! have a management `eth0` first and a second network, the fabric
//! (`slurm_lab::FABRIC_NET`), on an interface named differently on each node
//! (`ens1f0np0` on node1, `enp65s0f1` on node2), plus a `docker0` on node1
//! and a down `ens9` with a fabric address on node2.

use std::collections::BTreeMap;

use slurm_lab::agents::{AgentFiles, bin};
use slurm_lab::{FABRIC_NET, Lab};

use super::{CaseResult, LogMark, ok, output, run_batch, text};

/// Each node's `NCCL_SOCKET_IFNAME` and `GLOO_SOCKET_IFNAME` (`-` unset).
type PerNode = BTreeMap<String, (String, String)>;

/// [`PerNode`] from lines `IF HOST NCCL GLOO`.
fn per_node(out: &str) -> PerNode {
    out.lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("IF ")?.split(' ');
            Some((w.next()?.to_owned(), (w.next()?.to_owned(), w.next()?.to_owned())))
        })
        .collect()
}

const SHOW: &str = "echo IF $(hostname) ${NCCL_SOCKET_IFNAME--} ${GLOO_SOCKET_IFNAME--}";

fn step(lab: &Lab, env: &[(&str, &str)]) -> Result<(PerNode, String), String> {
    let mut cmd = lab.command("srun");
    cmd.args(["-N2", "--ntasks-per-node=1", "--auto-rdzv=verbose", "bash", "-c", SHOW]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (so, se) = ok(&mut cmd)?;
    Ok((per_node(&so), se))
}

fn pair(n: &str, g: &str) -> (String, String) {
    (n.to_owned(), g.to_owned())
}

/// `nccl_socket_net=` gives each node's tasks that node's own fabric name in
/// both variables (never the down `ens9` or `docker0`), verbose says what NCCL
/// and gloo use; a user's own value is kept with the rest still set; a
/// network no node has sets nothing, with a log line; a batch step's values
/// are not copied to the other node of an inner step.
pub fn nccl_socket_net_gives_each_node_its_own_interface(lab: &mut Lab) -> CaseResult {
    let result = fabric_cases(lab);
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    result
}

fn fabric_cases(lab: &mut Lab) -> CaseResult {
    let net = format!("nccl_socket_net={FABRIC_NET}");
    lab.set_plugstack_args(&[&net]).map_err(|e| e.to_string())?;
    let (got, se) = step(lab, &[])?;
    println!("nccl_socket_net={FABRIC_NET}: {got:?}");
    let want: PerNode = [
        ("node1".to_owned(), pair("=ens1f0np0", "ens1f0np0")),
        ("node2".to_owned(), pair("=enp65s0f1", "enp65s0f1")),
    ]
    .into();
    ensure!(got == want, "each node's own fabric name: got {got:?}\n{se}");
    ensure!(
        se.contains("network on node1: NCCL bootstrap ens1f0np0:10.78.0.11")
            && se.contains("network on node2: NCCL bootstrap enp65s0f1:10.78.0.12"),
        "verbose does not say what NCCL uses on each node:\n{se}"
    );

    // The user's own NCCL_SOCKET_IFNAME is kept; gloo's gap is still filled, and
    // the rendezvous is still set.
    let mut cmd = lab.command("srun");
    cmd.env("NCCL_SOCKET_IFNAME", "eth0").args([
        "-N2",
        "--ntasks-per-node=1",
        "--auto-rdzv",
        "bash",
        "-c",
        &format!("{SHOW} port=${{MASTER_PORT--}}"),
    ]);
    let (so, _) = ok(&mut cmd)?;
    let got = per_node(&so);
    println!("with the user's NCCL_SOCKET_IFNAME=eth0: {got:?}");
    ensure!(
        got.get("node1") == Some(&pair("eth0", "ens1f0np0"))
            && got.get("node2") == Some(&pair("eth0", "enp65s0f1"))
            && !so.contains("port=-"),
        "the user's NCCL_SOCKET_IFNAME=eth0: {so}"
    );

    // A batch step sets node1's names; the inner 2-node step gets each node's own.
    let script = format!(
        "#!/bin/bash\n#SBATCH -N2\n#SBATCH --ntasks-per-node=1\n#SBATCH --auto-rdzv\n\
         srun -N2 --ntasks-per-node=1 bash -c '{SHOW}'\n"
    );
    let out = run_batch(lab, &script)?;
    let got = per_node(&out);
    println!("an srun inside a batch step: {got:?}");
    ensure!(got == want, "inside a batch step: {got:?} (want each node's own)\n{out}");

    // A network no node has: nothing set, one line in each node's log.
    lab.set_plugstack_args(&["nccl_socket_net=10.99.0.0/24"]).map_err(|e| e.to_string())?;
    let mark = LogMark::new(lab);
    let (got, _) = step(lab, &[])?;
    ensure!(got.values().all(|v| *v == pair("-", "-")), "off the fabric: {got:?}");
    let line = mark.wait_for("no running interface of node2 has an address in it");
    println!("no node on 10.99.0.0/24: {got:?}; {}", line.as_deref().unwrap_or("(no log line)"));
    ensure!(line.is_some(), "no log line for node2:\n{}", mark.since());
    Ok(())
}

/// A literal `nccl_socket_ifname=` that only node1 has is set there and not
/// on node2, with a log line there.
pub fn a_literal_ifname_is_set_only_where_the_node_has_it(lab: &mut Lab) -> CaseResult {
    lab.set_plugstack_args(&["nccl_socket_ifname==ens1f0np0"]).map_err(|e| e.to_string())?;
    let mark = LogMark::new(lab);
    let result = step(lab, &[]);
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    let (got, se) = result?;
    let line = mark.wait_for("matches no running interface of node2");
    println!("nccl_socket_ifname==ens1f0np0: {got:?}; node2's log: {}", line.as_deref().unwrap_or("-"));
    ensure!(
        got.get("node1").map(|v| v.0.as_str()) == Some("=ens1f0np0")
            && got.get("node2").map(|v| v.0.as_str()) == Some("-"),
        "the literal on node1 only: {got:?}\n{se}"
    );
    ensure!(line.is_some(), "no log line naming node2:\n{}", mark.since());
    Ok(())
}

/// `gpu-node-agent status` on each node says where `nccl_socket_net` is there
/// (its own interface name) and what NCCL would pick by its own rules (the
/// management `eth0`, created first).
pub fn agent_status_says_where_the_fabric_is(lab: &mut Lab) -> CaseResult {
    let net = format!("nccl_socket_net={FABRIC_NET}");
    lab.set_plugstack_args(&[&net]).map_err(|e| e.to_string())?;
    let result = (|| {
        let agent = bin("gpu-node-agent").display().to_string();
        for (node, iface) in [("node1", "ens1f0np0"), ("node2", "enp65s0f1")] {
            let files = AgentFiles::new(lab, node)?;
            let cfg = files.config(lab, node, &bin("libfake_nvml.so"))?;
            let mut c = lab.command_on(node, &agent).map_err(|e| e.to_string())?;
            c.args(["--config", &cfg.display().to_string(), "status"])
                .env("FAKE_NVML_STATE", files.path("nvml.json"));
            let (so, se) = text(&output(&mut c)?);
            let lines: Vec<&str> =
                so.lines().chain(se.lines()).filter(|l| l.starts_with("network:")).collect();
            println!("{node}:\n  {}", lines.join("\n  "));
            let on = format!("network: nccl_socket_net={FABRIC_NET}: on {iface} (");
            ensure!(
                lines.iter().any(|l| l.starts_with(&on))
                    && lines
                        .iter()
                        .any(|l| l.contains("NCCL's own choice here") && l.contains("bootstrap eth0:")),
                "{node}'s status does not say the fabric is on {iface} and NCCL alone takes eth0:\n{so}{se}"
            );
        }
        Ok(())
    })();
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    result
}
