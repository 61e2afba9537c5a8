//! Slurm commands against the lab, and the jobs they submit.

use crate::*;

impl Lab {
    /// A command with the lab's `SLURM_CONF`, run in the lab's Slurm root
    /// when it has one (through `bin/in-root`), and ended (TERM, then KILL
    /// 10 s later, to its whole process group) past the limit
    /// [`Lab::limit_commands`] set: a test waits on a cluster that went wrong
    /// for that long, not forever.
    pub fn command(&self, program: &str) -> Command {
        let Some(limit) = self.command_limit else { return self.daemon_command(program) };
        let mut cmd = Command::new("timeout");
        cmd.arg("--kill-after=10").arg(limit.as_secs().max(1).to_string());
        if self.root.is_some() {
            cmd.arg(self.dir.join("bin/in-root"));
        }
        cmd.arg(program);
        cmd.env("SLURM_CONF", self.slurm_conf()).stdin(Stdio::null());
        cmd
    }

    /// [`Lab::command`] without a time limit: for daemons and interactive shells.
    pub fn daemon_command(&self, program: &str) -> Command {
        let mut cmd = match &self.root {
            None => Command::new(program),
            Some(_) => {
                let mut c = Command::new(self.dir.join("bin/in-root"));
                c.arg(program);
                c
            }
        };
        cmd.env("SLURM_CONF", self.slurm_conf()).stdin(Stdio::null());
        cmd
    }

    /// From now on, every [`Lab::command`] is ended after `limit`; its exit
    /// status is then 124 (TERM) or 137 (KILL), as `timeout(1)` reports it.
    pub fn limit_commands(&mut self, limit: Duration) {
        self.command_limit = Some(limit);
    }

    /// A command run inside a node (its network, hostname and hosts file).
    ///
    /// # Errors
    /// The node is not part of the lab.
    pub fn command_on(&self, node: &str, program: &str) -> Result<Command> {
        let Some(pid) = self.slurmd_pid(node) else { return err(format!("no node {node}")) };
        let mut cmd = Command::new("nsenter");
        cmd.env("SLURM_CONF", self.slurm_conf()).stdin(Stdio::null());
        cmd.args(["-t", &pid.to_string(), "-n", "-u", "-m"]);
        if self.root.is_some() {
            cmd.arg(self.dir.join("bin/in-root"));
        }
        cmd.arg(program);
        Ok(cmd)
    }

    /// Long state of each node as `sinfo` shows it (`idle`, `drained`, ...).
    ///
    /// # Errors
    /// sinfo failed.
    pub fn node_states(&self) -> Result<Vec<(String, String)>> {
        let out = run(self.command("sinfo").args(["-h", "-N", "-o", "%N %T"]))?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(n, s)| (n.to_owned(), s.trim().to_owned())))
            .collect())
    }

    /// Long state of one node.
    ///
    /// # Errors
    /// sinfo failed or does not list the node.
    pub fn node_state(&self, node: &str) -> Result<String> {
        self.node_states()?
            .into_iter()
            .find(|(n, _)| n == node)
            .map(|(_, s)| s)
            .ok_or_else(|| LabError(format!("sinfo does not list {node}")))
    }

    /// Submits a batch script (`#SBATCH` lines included); output goes to
    /// `out/JOBID.out` in the lab. Returns the job id.
    ///
    /// # Errors
    /// sbatch refused the job; the error has its stderr.
    pub fn sbatch(&self, script: &str, extra_args: &[&str]) -> Result<u32> {
        let out_pattern = self.dir.join("out/%j.out");
        let mut child = self
            .command("sbatch")
            .arg("--parsable")
            .arg(format!("--output={}", out_pattern.display()))
            .args(extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return err(format!("sbatch failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| LabError(format!("sbatch printed no job id: {text}")))
    }

    /// Waits for a job to end and returns its final state (`COMPLETED`, `FAILED`, ...).
    ///
    /// # Errors
    /// The job did not end in time.
    ///
    /// A job still `COMPLETING` at the deadline has ended and waits for its
    /// nodes' epilog answer; when a terminate request or its answer is lost,
    /// slurmctld resends it once the job has been completing for
    /// KillWait + 2 x MessageTimeout (50 s here), at its job purge of every
    /// 60 s (`_list_find_job_old`, job_mgr.c). Such a job gets that long
    /// (2 minutes) again, with one line saying so: a Slurm hiccup it recovers
    /// from is no failure of the case, a job that never finishes is.
    pub fn wait_job(&self, job: u32, timeout: Duration) -> Result<String> {
        let state_now = || {
            run(self.command("scontrol").args(["show", "job", "-o", &job.to_string()]))
                .map(|out| field(&String::from_utf8_lossy(&out.stdout), "JobState").unwrap_or_default())
                .unwrap_or_default()
        };
        let ended = |s: &str| !matches!(s, "" | "PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING");
        let mut state = String::new();
        // Each ask is an RPC to slurmctld: 4 a second, not 20, so that a
        // loaded 2-core machine's controller is not kept busy answering them.
        let every = Duration::from_millis(250);
        let mut done = wait_every(every, timeout, || {
            state = state_now();
            ended(&state)
        });
        let mut waited = timeout;
        if !done && state == "COMPLETING" {
            let resend = Duration::from_secs(120);
            println!(
                "(job {job} still COMPLETING after {timeout:?}: waiting {resend:?} more for Slurm's resend)"
            );
            done = wait_every(every, resend, || {
                state = state_now();
                ended(&state)
            });
            waited += resend;
            if done {
                println!("(job {job} ended {state} after the wait)");
            }
        }
        if done {
            Ok(state)
        } else {
            err(format!("job {job} still {state} after {waited:?}\n{}", self.job_report(job)))
        }
    }

    /// What the lab knows of a job that did not end: Slurm's record of it, the
    /// log lines that name it, and the processes left on the nodes. Short enough
    /// to read in a CI excerpt.
    pub fn job_report(&self, job: u32) -> String {
        let record = run(self.command("scontrol").args(["show", "job", "-o", &job.to_string()]))
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| e.0);
        let keep = ["JobState", "Reason", "NodeList", "BatchHost", "RunTime", "EndTime", "ExitCode"];
        let record: Vec<&str> = record
            .split_whitespace()
            .filter(|w| keep.iter().any(|k| w.starts_with(&format!("{k}="))))
            .collect();
        let mut out = format!("--- job {job}: {} ---\n", record.join(" "));
        let needles = [
            format!("JobId={job} "),
            format!("job {job} "),
            format!("StepId={job}."),
            format!("job_{job}/"),
            format!("{job}.batch"),
            format!("{job}.extern"),
        ];
        let mut logs: Vec<PathBuf> = self.nodes.iter().map(|n| self.slurmd_log(n)).collect();
        logs.push(self.slurmctld_log());
        for log in logs {
            let text = fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> =
                text.lines().filter(|l| needles.iter().any(|n| l.contains(n.as_str()))).collect();
            let name = log.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            let _ = writeln!(out, "--- {name}: {} lines name it, the last 12 ---", lines.len());
            for l in &lines[lines.len().saturating_sub(12)..] {
                let _ = writeln!(out, "{l}");
            }
        }
        let ps = Command::new("ps")
            .args(["-eo", "pid,ppid,stat,wchan:20,etimes,args", "--sort=pid"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        // Every slurmstepd and what runs under it: a job that does not end has one left.
        let rows: Vec<(u32, u32, &str)> = ps
            .lines()
            .skip(1)
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?, l))
            })
            .collect();
        let parent: std::collections::HashMap<u32, u32> = rows.iter().map(|&(p, pp, _)| (p, pp)).collect();
        let is_stepd: std::collections::HashSet<u32> =
            rows.iter().filter(|r| r.2.contains("slurmstepd")).map(|r| r.0).collect();
        let under_stepd = |mut pid: u32| {
            for _ in 0..64 {
                if is_stepd.contains(&pid) {
                    return true;
                }
                match parent.get(&pid) {
                    Some(&pp) if pp > 1 => pid = pp,
                    _ => return false,
                }
            }
            false
        };
        let steps: Vec<&str> = rows.iter().filter(|r| under_stepd(r.0)).map(|r| r.2).collect();
        let _ = writeln!(out, "--- slurmstepd and its processes ({}) ---", steps.len());
        for l in steps.iter().take(25) {
            let _ = writeln!(out, "{l}");
        }
        out
    }

    /// The output file of a batch job.
    pub fn job_output(&self, job: u32) -> String {
        fs::read_to_string(self.dir.join(format!("out/{job}.out"))).unwrap_or_default()
    }
}
