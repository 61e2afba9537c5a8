//! `spank-gpu lint` on the lab, and its checks at submit time inside sbatch
//! (`lint=warn|strict` on the plugstack line).
//!
//! With `SLURM_LAB_LINT_RECORD=DIR`, `cli_reads_the_lab` also writes the
//! lab's answers to the commands lint asks into DIR (to refresh
//! `lint/tests/fixtures/lint/cluster/lab-22.05`).

use std::fs;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use batch_lint::facts;
use serde_json::Value;
use slurm_lab::{Lab, agents};

use super::{CaseResult, ok, output, text};

fn spank_gpu() -> String {
    agents::bin("spank-gpu").display().to_string()
}

/// Writes a script into the lab's `out/` and returns its path.
fn script(lab: &Lab, name: &str, body: &str) -> Result<String, String> {
    let path = lab.dir.join("out").join(name);
    fs::write(&path, body).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path.display().to_string())
}

/// `sbatch --parsable --hold FILE` from the lab's directory (the job waits,
/// held, so that nothing runs): (exit code, stdout, stderr).
fn submit(lab: &Lab, path: &str) -> Result<(i32, String, String), String> {
    let out = output(lab.command("sbatch").args(["--parsable", "--hold", path]).current_dir(&lab.dir))?;
    let (so, se) = text(&out);
    Ok((out.status.code().unwrap_or(-1), so, se))
}

/// Cancels a job and waits until Slurm is done with it.
fn cancel(lab: &Lab, job: &str) {
    let _ = lab.command("scancel").arg(job).output();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        let out = lab.command("squeue").args(["-h", "-j", job, "-o", "%T"]).output();
        let s = out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default();
        if s.is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The job's state in squeue (`PENDING`, ...).
fn queued(lab: &Lab, job: &str) -> String {
    let out = lab.command("squeue").args(["-h", "-r", "-j", job, "-o", "%T"]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").trim().to_owned())
        .unwrap_or_default()
}

/// Traps 2, 3 and 10 (and none other on the lab: `--time` is given, the
/// output directory exists).
fn traps_2_3_10(lab: &Lab) -> String {
    format!(
        "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --time=5\n#SBATCH --array=0-1\n#SBATCH --output={}/out/lint-same.out\n\
         #SBATCH --signal=USR1@60\ntrap 'echo caught' USR1\nsrun hostname &\nwait\n",
        lab.dir.display()
    )
}

/// sbatch prints traps 2, 3 and 10, one line each, and still queues the job.
pub fn submit_warns_and_queues(lab: &mut Lab) -> CaseResult {
    let path = script(lab, "lint-warn.sh", &traps_2_3_10(lab))?;
    let (rc, so, se) = submit(lab, &path)?;
    ensure!(rc == 0, "sbatch failed ({rc}): {so}{se}");
    let job = so.trim().split(';').next().unwrap_or("").to_owned();
    let state = queued(lab, &job);
    cancel(lab, &job);
    ensure!(state == "PENDING", "job {job} is '{state}', not queued:\n{se}");
    let lines: Vec<&str> = se.lines().filter(|l| l.contains("spank-gpu: ")).collect();
    ensure!(lines.len() == 3, "expected 3 finding lines on sbatch's stderr, got:\n{se}");
    for (want, line) in [
        (format!("{path}:5: --output="), lines[0]),
        (
            format!("{path}:6: --signal=USR1@60 sends USR1 to the job's steps, not to the batch shell"),
            lines[1],
        ),
        (format!("{path}:8: srun spans 2 nodes without --kill-on-bad-exit=1"), lines[2]),
    ] {
        ensure!(line.contains(&want) && line.contains("; fix: "), "'{want}' not in:\n{se}");
    }
    ensure!(lines[0].contains("names no %a (or %j) in an array job"), "trap 2's words:\n{se}");
    Ok(())
}

/// `lint=strict`: a GRES type the lab does not have refuses the submit with
/// the finding's words; traps 2, 3 and 10 still only warn.
pub fn strict_refuses_trap_8(lab: &mut Lab) -> CaseResult {
    lab.set_plugstack_args(&["lint=strict"]).map_err(|e| e.to_string())?;
    let result = (|| -> CaseResult {
        let path = script(
            lab,
            "lint-strict.sh",
            "#!/bin/bash\n#SBATCH --time=5\n#SBATCH --gres=gpu:a100:2\nsrun hostname\n",
        )?;
        let (rc, so, se) = submit(lab, &path)?;
        if rc == 0 {
            cancel(lab, so.trim());
        }
        ensure!(rc != 0, "lint=strict queued job {so} with trap 8:\n{se}");
        ensure!(
            se.contains(&format!(
                "{path}:3: --gres=gpu:a100:2: no node of this cluster has gpu:a100 (it has gpu:h100:8)"
            )),
            "the finding's words are not on sbatch's stderr:\n{se}"
        );
        ensure!(se.contains("lint=strict: the job is not submitted"), "no refusal line:\n{se}");
        let path = script(lab, "lint-strict-warn.sh", &traps_2_3_10(lab))?;
        let (rc, so, se) = submit(lab, &path)?;
        ensure!(rc == 0, "lint=strict refused traps 2, 3, 10 ({rc}):\n{se}");
        cancel(lab, so.trim().split(';').next().unwrap_or(""));
        Ok(())
    })();
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    result
}

/// `spank-gpu lint --json` asks the lab: its release, the GRES names and the
/// partition's MaxTime, KillOnBadExit.
pub fn cli_reads_the_lab(lab: &mut Lab) -> CaseResult {
    let path =
        script(lab, "lint-cli.sh", "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gres=gpu:a100:2\nsrun hostname\n")?;
    let out = output(lab.command(&spank_gpu()).args(["lint", "--json", &path]))?;
    let (so, se) = text(&out);
    ensure!(out.status.code() == Some(1), "spank-gpu lint exited {:?}:\n{so}{se}", out.status.code());
    let v: Value = serde_json::from_str(so.trim()).map_err(|e| format!("not JSON ({e}):\n{so}"))?;
    let version = output(lab.command("scontrol").arg("--version"))?;
    let want = facts::parse_version(&text(&version).0).ok_or("scontrol --version unreadable")?;
    ensure!(
        v["release"]["number"] == want && v["release"]["from"] == "scontrol --version",
        "release: {}",
        v["release"]
    );
    ensure!(v["cluster"]["partitions"][0]["name"] == "debug", "partitions: {}", v["cluster"]["partitions"]);
    ensure!(
        v["cluster"]["partitions"][0]["max_time_s"].is_null(),
        "debug's MaxTime is INFINITE: {}",
        v["cluster"]
    );
    let ids: Vec<&str> = v["findings"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["id"].as_str()).collect())
        .unwrap_or_default();
    ensure!(ids == ["time-at-max", "gres-type", "kill-on-bad-exit"], "findings {ids:?}:\n{so}");
    ensure!(
        v["findings"][1]["what"].as_str().is_some_and(|w| w.contains("it has gpu:h100:8")),
        "{}",
        v["findings"][1]
    );
    if let Some(dir) = std::env::var_os("SLURM_LAB_LINT_RECORD") {
        let dir = std::path::PathBuf::from(dir);
        fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        for (file, prog, args) in [
            ("sinfo.txt", "sinfo", facts::SINFO_ARGS),
            ("config.txt", "scontrol", facts::CONFIG_ARGS),
            ("version.txt", "scontrol", facts::VERSION_ARGS),
        ] {
            let o = output(lab.command(prog).args(args))?;
            fs::write(dir.join(file), &o.stdout).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// A slurmdbd of the case's own when the lab's was stopped (the accounting
/// cluster's last `why`/`autopsy` case stops it); ended by its pid when dropped.
struct Dbd(Option<Child>);

impl Drop for Dbd {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn accounting_up(lab: &Lab) -> bool {
    lab.command("sacctmgr").args(["-n", "-P", "show", "cluster"]).output().is_ok_and(|o| o.status.success())
}

fn ensure_dbd(lab: &Lab) -> Result<Dbd, String> {
    if accounting_up(lab) {
        return Ok(Dbd(None));
    }
    // The lab's own slurmdbd: the host's, or the one in the release's root.
    let child = lab
        .daemon_command("slurmdbd")
        .arg("-D")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("slurmdbd: {e}"))?;
    let dbd = Dbd(Some(child));
    let t = Instant::now();
    while !accounting_up(lab) {
        ensure!(t.elapsed() < Duration::from_secs(60), "slurmdbd did not come back");
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(dbd)
}

/// A QoS in accounting that another lists in its `Preempt`: lint reads it
/// with `sacctmgr show qos` (and, the lab having `PreemptType=preempt/none`,
/// says why it is no trap here).
pub fn preemptible_qos_in_accounting(lab: &mut Lab) -> CaseResult {
    let _dbd = ensure_dbd(lab)?;
    let add = |args: &[&str]| output(lab.command("sacctmgr").arg("-i").args(args));
    add(&["add", "qos", "lintlow"])?;
    add(&["add", "qos", "linthigh", "Preempt=lintlow"])?;
    let result = (|| -> CaseResult {
        let path = script(
            lab,
            "lint-qos.sh",
            "#!/bin/bash\n#SBATCH --qos=lintlow\n#SBATCH --time=5\nsrun --kill-on-bad-exit=1 hostname\n",
        )?;
        let out = output(lab.command(&spank_gpu()).args(["lint", "--json", &path]))?;
        let (so, se) = text(&out);
        let v: Value = serde_json::from_str(so.trim()).map_err(|e| format!("not JSON ({e}):\n{so}{se}"))?;
        let qos = v["cluster"]["qos"].as_array().cloned().unwrap_or_default();
        let high = qos.iter().find(|q| q["name"] == "linthigh");
        ensure!(
            high.is_some_and(|q| q["preempts"].as_array().is_some_and(|p| p.iter().any(|x| x == "lintlow"))),
            "linthigh's Preempt=lintlow not read from accounting: {}",
            v["cluster"]["qos"]
        );
        let notes = v["not_checked"].to_string();
        ensure!(
            notes.contains("QoS lintlow is in the Preempt list of linthigh, but PreemptType is preempt/none"),
            "no note on PreemptType: {notes}"
        );
        Ok(())
    })();
    let _ = add(&["delete", "qos", "linthigh"]);
    let _ = add(&["delete", "qos", "lintlow"]);
    result
}

/// A 2-node script whose `srun` lacks `--kill-on-bad-exit=1` (trap 10, the one
/// finding lint has for it on the lab), printing a first and a last line:
/// a job that prints both ran the whole script.
fn two_lines(mark: &str) -> String {
    let filler: String = (0..200).map(|i| format!("# filler line {i} of a generated script\n")).collect();
    format!(
        "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --time=5\necho \"first {mark}\"\n{filler}srun hostname >/dev/null\necho \"last {mark}\"\n"
    )
}

/// `sbatch <(...)`, `... | sbatch /dev/stdin` and `sbatch FIFO` (its writer
/// opening it a second later) with the plugin at its defaults (`lint=warn`):
/// sbatch gets the whole script and the job prints what the script says. The
/// plugin leaves such a script to sbatch (one line at debug level, which
/// sbatch never shows: its `-v` takes effect after the plugin's init); the
/// same script as a file gets its finding, so lint was on.
pub fn pipe_scripts_reach_sbatch_whole(lab: &mut Lab) -> CaseResult {
    let out = lab.dir.join("out");
    let fifo = out.join("lint-fifo");
    let _ = fs::remove_file(&fifo);
    let shapes = [
        ("procsub", "sbatch --parsable --output=\"$OUT\" <(printf '%s' \"$SCRIPT\")".to_owned()),
        ("stdin", "printf '%s' \"$SCRIPT\" | sbatch --parsable --output=\"$OUT\" /dev/stdin".to_owned()),
        (
            "fifo",
            format!(
                "mkfifo {f} && {{ (sleep 1; printf '%s' \"$SCRIPT\" > {f}) & }} && sbatch --parsable --output=\"$OUT\" {f}; rc=$?; wait; exit $rc",
                f = fifo.display()
            ),
        ),
    ];
    let mut jobs = Vec::new();
    for (shape, line) in &shapes {
        let file = out.join(format!("lint-{shape}.out"));
        let started = Instant::now();
        let o = output(
            lab.command("bash")
                .args(["-c", line])
                .env("SCRIPT", two_lines(shape))
                .env("OUT", &file)
                .current_dir(&lab.dir),
        )?;
        let (so, se) = text(&o);
        ensure!(o.status.success(), "{shape}: `{line}` failed ({}):\n{so}{se}", o.status);
        ensure!(!se.contains("empty"), "{shape}: sbatch found the script empty:\n{se}");
        ensure!(!se.contains("kill-on-bad-exit"), "{shape}: the plugin read sbatch's script:\n{se}");
        let job: u32 = so
            .trim()
            .split(';')
            .next()
            .unwrap_or("")
            .parse()
            .map_err(|_| format!("{shape}: no job id: {so}{se}"))?;
        println!("  {shape}: job {job} submitted in {:.1} s", started.elapsed().as_secs_f64());
        jobs.push((shape, job, file));
    }
    for (shape, job, file) in jobs {
        let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
        let printed = fs::read_to_string(&file).unwrap_or_default();
        ensure!(state == "COMPLETED", "{shape}: job {job} {state}:\n{printed}");
        ensure!(
            printed.contains(&format!("first {shape}")) && printed.contains(&format!("last {shape}")),
            "{shape}: job {job} did not run the whole script; it printed:\n{printed}"
        );
        println!("  {shape}: job {job} COMPLETED and printed: {}", printed.trim().replace('\n', " | "));
    }
    let _ = fs::remove_file(&fifo);
    // The same script as a file: lint reads it and says trap 10.
    let path = script(lab, "lint-regular.sh", &two_lines("file"))?;
    let (rc, so, se) = submit(lab, &path)?;
    if rc == 0 {
        cancel(lab, so.trim());
    }
    ensure!(
        rc == 0 && se.contains("without --kill-on-bad-exit=1"),
        "a regular file was not checked ({rc}):\n{se}"
    );
    Ok(())
}

/// `lint=strict` judges a directory as the kernel does for the user sbatch
/// runs as: an output directory `nobody` can write only through an ACL is
/// accepted and the job writes its log there; one `nobody` cannot write is a
/// warning (the submit host's view is not the compute node's), never a refusal.
pub fn strict_judges_access_as_the_kernel(lab: &mut Lab) -> CaseResult {
    let base = lab.dir.join("out/lint-acl");
    let (acl, closed) = (base.join("acl"), base.join("closed"));
    let _ = fs::remove_dir_all(&base);
    for d in [&base, &acl, &closed] {
        fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    ok(lab.command("setfacl").args(["-m", "u:nobody:rwx"]).arg(&acl))?;
    let job_sh = base.join("job.sh");
    fs::write(&job_sh, "#!/bin/bash\n#SBATCH --time=5\necho \"written through the ACL by $(id -un)\"\n")
        .map_err(|e| e.to_string())?;
    lab.set_plugstack_args(&["lint=strict"]).map_err(|e| e.to_string())?;
    let result = (|| -> CaseResult {
        let as_nobody = |dir: &std::path::Path, extra: &[&str]| -> Result<(i32, String, String), String> {
            let o = output(
                lab.command("setpriv")
                    .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "sbatch", "--parsable"])
                    .args(extra)
                    .arg(format!("--chdir={}", dir.display()))
                    .arg(format!("--output={}/job.out", dir.display()))
                    .arg(&job_sh),
            )?;
            let (so, se) = text(&o);
            Ok((o.status.code().unwrap_or(-1), so, se))
        };
        let (rc, so, se) = as_nobody(&acl, &[])?;
        ensure!(
            rc == 0,
            "lint=strict refused an output directory nobody can write through an ACL ({rc}):\n{se}"
        );
        ensure!(!se.contains("cannot write"), "a finding for a writable directory:\n{se}");
        let job: u32 = so.trim().parse().map_err(|_| format!("no job id: {so}{se}"))?;
        let state = lab.wait_job(job, Duration::from_secs(60)).map_err(|e| e.to_string())?;
        let log = fs::read_to_string(acl.join("job.out")).unwrap_or_default();
        ensure!(state == "COMPLETED", "job {job} {state}: {log}");
        ensure!(log.contains("written through the ACL by nobody"), "job {job}'s log: '{log}'");
        println!("  ACL: job {job} COMPLETED, its log says: {}", log.trim());
        let (rc, so, se) = as_nobody(&closed, &["--hold"])?;
        if rc == 0 {
            cancel(lab, so.trim());
        }
        ensure!(rc == 0, "lint=strict refused a directory only the submit host judged ({rc}):\n{se}");
        ensure!(
            se.contains(&format!("you cannot write in {}", closed.display())) && !se.contains("error:"),
            "no warning (or an error) for a directory nobody cannot write:\n{se}"
        );
        println!("  closed: accepted with {}", se.lines().find(|l| l.contains("cannot write")).unwrap_or(""));
        Ok(())
    })();
    lab.set_plugstack_args(&[]).map_err(|e| e.to_string())?;
    let _ = fs::remove_dir_all(&base);
    result
}
