//! `spank-gpu lint`'s script reader (`#SBATCH` lines as sbatch splits them,
//! the shell's commands, srun lines), the job built from it, and the checks
//! over it with cluster answers parsed from the same bytes. None may panic.
#![no_main]
use batch_lint::facts::{self, Cluster};
use batch_lint::{self as lint, DirState, Facts, Input, Release, script};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = script::directive_words(&String::from_utf8_lossy(data));
    let Ok(s) = script::read(data) else { return };
    let text = String::from_utf8_lossy(data);
    let cluster = Cluster {
        from: "fuzz".into(),
        partitions: Ok(facts::parse_sinfo(&text)),
        config: Ok(facts::parse_config(&text)),
        qos: Ok(facts::parse_qos(&text)),
        jobs: Ok(facts::parse_job_qos(&text)),
    };
    let conf = facts::from_slurm_conf(&text, "slurm.conf");
    let _ = facts::parse_version(&text);
    for (release, cluster) in [((22 << 16) | (5 << 8), cluster), ((25 << 16) | (11 << 8), conf)] {
        let input = Input {
            file: "job.sh".into(),
            cwd: "/home/u".into(),
            user: "u".into(),
            release,
            ..Input::default()
        };
        let report = lint::lint(&s, &input, |needs| Facts {
            release: Release { number: release, from: "fuzz".into() },
            cluster,
            dirs: needs
                .dirs
                .iter()
                .map(|d| (d.clone(), DirState::Missing { ancestor: "/".into(), writable: false }))
                .collect(),
        });
        for f in &report.findings {
            let _ = f.one_line("job.sh");
        }
    }
});
