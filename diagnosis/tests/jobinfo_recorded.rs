//! `why`/`autopsy`'s parsers on what real Slurm releases printed in the lab
//! (`fixtures/jobinfo/recorded/RELEASE/`, written by `slurm-lab record-jobs`
//! on 22.05, 24.11 and 26.05 with accounting): every text record and, from
//! 24.11, every v0.0.42 JSON document reads as the job it was, and the held
//! job's own `Key=Value` words (in its name, comment, output path and
//! command line) are never taken for fields.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

use job_diagnosis::{
    Release, Row, explain_reason, parse_job_record, parse_parsable, parse_sacct_jobs, parse_scontrol_jobs,
    why,
};

fn recorded() -> Vec<(Release, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobinfo/recorded");
    let mut out: Vec<(Release, PathBuf)> = fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter_map(|dir| {
            let version = fs::read_to_string(dir.join("VERSION")).ok()?;
            Some((Release::from_version_output(&version).expect("VERSION names a release"), dir))
        })
        .collect();
    out.sort_by_key(|(r, _)| *r);
    out
}

/// The job of one `NAME.scontrol` (text) and, where recorded, `NAME.scontrol.json`.
fn jobs(dir: &Path, name: &str) -> Vec<(String, Row)> {
    let mut out = Vec::new();
    let text = fs::read_to_string(dir.join(format!("{name}.scontrol"))).unwrap();
    let row =
        parse_job_record(text.trim()).unwrap_or_else(|e| panic!("{}/{name}.scontrol: {e}", dir.display()));
    out.push((format!("{name}.scontrol"), row));
    if let Ok(json) = fs::read_to_string(dir.join(format!("{name}.scontrol.json"))) {
        let rows = parse_scontrol_jobs(&json).unwrap_or_else(|e| panic!("{name}.scontrol.json: {e}"));
        assert_eq!(rows.len(), 1, "{name}.scontrol.json");
        out.push((format!("{name}.scontrol.json"), rows.into_iter().next().unwrap()));
    }
    out
}

#[test]
fn every_release_is_recorded() {
    let releases: Vec<String> = recorded().iter().map(|(r, _)| r.to_string()).collect();
    for want in ["22.05", "24.11", "26.05"] {
        assert!(releases.iter().any(|r| r.starts_with(want)), "no recording of {want}: {releases:?}");
    }
}

#[test]
fn pending_jobs_read_as_the_reason_slurm_gave() {
    for (release, dir) in recorded() {
        for (name, reason) in [
            ("held-keyvalue", "JobHeldUser"),
            ("depfail", "DependencyNeverSatisfied"),
            ("resources", "Resources"),
            ("reqnode", "ReqNodeNotAvail"),
        ] {
            for (file, row) in jobs(&dir, name) {
                let at = format!("{release} {file}");
                assert_eq!(row.get("JobState").map(String::as_str), Some("PENDING"), "{at}: {row:?}");
                let got = row.get("Reason").cloned().unwrap_or_default();
                assert!(got.starts_with(reason), "{at}: reason {got}");
                let w = why(&row, "0", release);
                assert!(!w.meaning.contains("not in spank-gpu's table"), "{at}: {}", w.meaning);
                assert!(explain_reason(reason).is_some(), "{at}: {reason} has no words");
            }
        }
    }
}

#[test]
fn a_held_jobs_own_words_are_never_fields() {
    for (release, dir) in recorded() {
        for (file, row) in jobs(&dir, "held-keyvalue") {
            let at = format!("{release} {file}");
            assert_eq!(row.get("JobState").map(String::as_str), Some("PENDING"), "{at}");
            assert_ne!(row.get("Reason").map(String::as_str), Some("None"), "{at}");
            assert_eq!(row.get("JobName").map(String::as_str), Some("JobState=RUNNING"), "{at}: {row:?}");
        }
    }
}

#[test]
fn ended_jobs_read_as_they_ended() {
    for (release, dir) in recorded() {
        for (name, state, exit) in [("exit3", "FAILED", "3:0"), ("cancelled", "CANCELLED", "")] {
            let text = fs::read_to_string(dir.join(format!("{name}.sacct"))).unwrap();
            let rows = parse_parsable(&text);
            let job = &rows[0];
            let at = format!("{release} {name}.sacct");
            assert!(job["State"].starts_with(state), "{at}: {job:?}");
            if !exit.is_empty() {
                assert_eq!(job["ExitCode"], exit, "{at}");
            }
            if let Ok(json) = fs::read_to_string(dir.join(format!("{name}.sacct.json"))) {
                let rows = parse_sacct_jobs(&json, release).unwrap_or_else(|e| panic!("{at}.json: {e}"));
                let job = &rows[0];
                assert!(job["State"].starts_with(state), "{at}.json: {job:?}");
                if !exit.is_empty() {
                    assert_eq!(job["ExitCode"], exit, "{at}.json");
                }
            }
        }
        // Over --mem=20M: OverMemoryKill ends it (FAILED 0:9), or a cgroup limit (OUT_OF_MEMORY).
        let text = fs::read_to_string(dir.join("oom.sacct")).unwrap();
        let job = &parse_parsable(&text)[0];
        assert!(matches!(job["State"].as_str(), "FAILED" | "OUT_OF_MEMORY"), "{release} oom.sacct: {job:?}");
        // A missing --output directory: 22.05 fails the job; from 23.02 slurmstepd makes it.
        let text = fs::read_to_string(dir.join("nodir.sacct")).unwrap();
        let job = &parse_parsable(&text)[0];
        let want = if release >= Release::new(23, 2, 0) { "COMPLETED" } else { "FAILED" };
        assert_eq!(job["State"], want, "{release} nodir.sacct");
    }
}

/// The typed v0.0.42 reader (`parse_scontrol_jobs`, `parse_sacct_jobs`) on
/// every recorded JSON answer gives the values the text reader finds in the
/// same release's text answer for the same job, field by field where both
/// forms print the field the same way (the text forms print times in local
/// time, `NumNodes` as a range, `CANCELLED by UID`, and leave out what
/// `-o` did not ask for).
#[test]
fn the_json_form_reads_as_the_text_form() {
    let mut compared = 0;
    for (release, dir) in recorded() {
        for name in ["held-keyvalue", "depfail", "resources", "reqnode", "oom", "nodir"] {
            let Ok(json) = fs::read_to_string(dir.join(format!("{name}.scontrol.json"))) else { continue };
            let text = fs::read_to_string(dir.join(format!("{name}.scontrol"))).unwrap();
            let text = parse_job_record(text.trim()).unwrap();
            let json = &parse_scontrol_jobs(&json).unwrap()[0];
            for key in [
                "JobId",
                "JobName",
                "UserId",
                "Account",
                "JobState",
                "Reason",
                "Dependency",
                "ExitCode",
                "TimeLimit",
                "ReqNodeList",
                "ExcNodeList",
                "NodeList",
                "BatchFlag",
                "MinMemoryCPU",
                "WorkDir",
                "Partition",
            ] {
                assert_eq!(json.get(key), text.get(key), "{release} {name}.scontrol(.json) {key}");
                compared += 1;
            }
            // The reason's own string, which the text form shows first.
            assert!(text["Reason"].starts_with(&json["ReasonCode"]), "{release} {name}: {json:?}");
        }
        for name in ["exit3", "cancelled", "oom", "nodir"] {
            let Ok(json) = fs::read_to_string(dir.join(format!("{name}.sacct.json"))) else { continue };
            let text = parse_parsable(&fs::read_to_string(dir.join(format!("{name}.sacct"))).unwrap());
            let json = parse_sacct_jobs(&json, release).unwrap();
            assert_eq!(json.len(), text.len(), "{release} {name}.sacct(.json): the job and its steps");
            for (j, t) in json.iter().zip(&text) {
                let at = format!("{release} {name}.sacct(.json) {}", t["JobID"]);
                // A step's JSON row has fewer fields: those it has.
                let keys = [
                    "JobID",
                    "JobName",
                    "User",
                    "ExitCode",
                    "DerivedExitCode",
                    "Elapsed",
                    "Timelimit",
                    "NodeList",
                ];
                for key in keys.into_iter().filter(|k| j.contains_key(*k)) {
                    assert_eq!(j.get(key), t.get(key), "{at} {key}");
                    compared += 1;
                }
                let word = |r: &Row| r["State"].split(' ').next().map(str::to_owned);
                assert_eq!(word(j), word(t), "{at} State");
            }
        }
    }
    assert!(compared >= 250, "{compared} values compared");
}
