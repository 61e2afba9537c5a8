//! Which Slurm release `why`/`autopsy` talk to, and what that release offers
//! them: one table ([`FEATURES`]), each fact taken from Slurm's source at the
//! release's tag.
//!
//! The release is the one `scontrol --version` reports (the installed client,
//! whose output the commands read), else the one the command was built for
//! (`slurm_sys::VERSION_NUMBER`, the headers of the package it came in): see
//! [`Release::pick`].

use std::fmt;

/// A Slurm release: `24.11.5`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    /// `24` of 24.11.5.
    pub major: u8,
    /// `11` of 24.11.5.
    pub minor: u8,
    /// `5` of 24.11.5.
    pub micro: u8,
}

impl Release {
    /// `major.minor.micro`.
    pub const fn new(major: u8, minor: u8, micro: u8) -> Release {
        Release { major, minor, micro }
    }

    /// From Slurm's `SLURM_VERSION_NUMBER`: `(major << 16) | (minor << 8) | micro`.
    pub const fn from_version_number(n: u32) -> Release {
        // Each part is one byte of the number by definition.
        #[allow(clippy::cast_possible_truncation)]
        Release::new((n >> 16) as u8, (n >> 8) as u8, n as u8)
    }

    /// The release in `scontrol --version`'s answer (`slurm 24.11.5`, or
    /// `slurm-wlm 22.05.8` as Debian builds it); `None` for anything else.
    pub fn from_version_output(text: &str) -> Option<Release> {
        let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
        let (name, version) = line.split_once(' ')?;
        if !name.starts_with("slurm") {
            return None;
        }
        let mut parts = version.trim().split(['.', '-']);
        let mut next = || parts.next().and_then(|p| p.parse::<u8>().ok());
        let (major, minor) = (next()?, next()?);
        Some(Release::new(major, minor, next().unwrap_or(0)))
    }

    /// The release to use: what `scontrol --version` said (the client whose
    /// output is read), else the one this command was built for. The build
    /// release is right for the major.minor on every site that runs the
    /// plugin (which loads only into its own release); the installed client
    /// also knows the micro, and stays right on a host where the two differ.
    pub fn pick(installed: Option<Release>, built: Release) -> Release {
        installed.unwrap_or(built)
    }

    /// The release series: `24.11` of 24.11.5.
    pub const fn series(self) -> (u8, u8) {
        (self.major, self.minor)
    }

    /// Whether this release has `feature` ([`FEATURES`]).
    pub fn has(self, feature: Feature) -> bool {
        FEATURES.iter().any(|(f, since, until)| *f == feature && self.within(*since, *until))
    }

    /// Whether this release is `since` or newer and, with `until`, in
    /// `until`'s series or older.
    pub fn within(self, since: Release, until: Option<Release>) -> bool {
        self >= since && until.is_none_or(|u| self.series() <= u.series())
    }

    /// The data_parser plugin that `scontrol show job --json` and
    /// `sacct --json` are asked for on this release, when it has one that
    /// `why`/`autopsy` read.
    pub fn json_parser(self) -> Option<&'static str> {
        self.has(Feature::DataParserV0042).then_some("v0.0.42")
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:02}.{}", self.major, self.minor, self.micro)
    }
}

/// Slurm 22.05, the oldest release this code knows (and what "since 22.05"
/// means: at least since then).
pub const R22_05: Release = Release::new(22, 5, 0);
/// Slurm 23.02.
pub const R23_02: Release = Release::new(23, 2, 0);
/// Slurm 23.02.3 (`WAIT_RESV_INVALID` came in this micro release).
pub const R23_02_3: Release = Release::new(23, 2, 3);
/// Slurm 23.11.
pub const R23_11: Release = Release::new(23, 11, 0);
/// Slurm 24.05.
pub const R24_05: Release = Release::new(24, 5, 0);
/// Slurm 24.11.
pub const R24_11: Release = Release::new(24, 11, 0);
/// Slurm 25.05.
pub const R25_05: Release = Release::new(25, 5, 0);
/// Slurm 25.11.
pub const R25_11: Release = Release::new(25, 11, 0);
/// Slurm 26.05, the newest release this code was read against.
pub const R26_05: Release = Release::new(26, 5, 0);

/// Something a Slurm release does that `why`/`autopsy` depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// slurmstepd creates a missing `--output`/`--error` directory (as the
    /// job's user, mode 0755) before opening the file: commit ecc671a141
    /// "Allow recursive directory creation for job stderr/stdout files"
    /// (Bug 14865), first in slurm-23-02-0-0rc1, `mkdirpath()` in
    /// `src/slurmd/slurmstepd/io.c`. Before, a missing directory failed the
    /// job at launch (`ExitCode 0:53`, with no log).
    CreatesOutputDirs,
    /// `sacct` has `StdOut`/`StdErr`/`StdIn` and `--expand-patterns`
    /// (src/sacct/options.c, print.c, slurm-24-05-0-1), so a job's log is
    /// found after slurmctld forgot the job.
    SacctStdPaths,
    /// `sacct --expand-patterns` (and `stdout_expanded` in `sacct --json`)
    /// joins a relative path to the working directory without a `/`
    /// (`expand_stdio_fields()` in src/common/print_fields.c: `xstrcatat(expanded,
    /// &pos, job->work_dir)`); 25.11 adds the separator.
    SacctExpandWithoutSlash,
    /// data_parser/v0.0.42 (`scontrol show job --json=v0.0.42`,
    /// `sacct --json=v0.0.42`): src/plugins/data_parser/v0.0.42 is in the
    /// tags slurm-24-11-0-1 through slurm-26-05-3-1 (v0.0.41 and older
    /// before; 26.11 drops it).
    DataParserV0042,
    /// `scontrol show job` prints `SubmitLine=`, the whole command line with
    /// its spaces (src/scontrol/info_job.c, slurm-25-11-0-1).
    SubmitLine,
    /// `--requeue=expedite` (src/common/slurm_opt.c `arg_set_requeue`,
    /// doc/man/man1/sbatch.1, slurm-25-11-0-1): a job that loses a node, or
    /// whose node's epilog fails after it exits non-zero, is requeued at once
    /// at the top of the queue, where the site allows it
    /// (`SlurmctldParameters=enable_expedited_requeue`). Its state meanwhile
    /// is `EXPEDITING`.
    ExpeditedRequeue,
    /// A topology plugin's rejection is the pending reason's text
    /// (`Reason=No_suitable_topology_unit_found`, the `ESLURM_TOPO_*`
    /// messages of src/common/slurm_errno.c, slurm-26-05-0-1) with the
    /// reason code `Resources` (src/slurmctld/node_scheduler.c).
    TopologyReasons,
    /// srun reads `SLURM_CPUS_PER_TASK` (which sbatch sets from
    /// `--cpus-per-task`) again, so a step inherits the job's CPUs per task:
    /// 23.11 NEWS "Replace SRUN_CPUS_PER_TASK with SLURM_CPUS_PER_TASK and get
    /// back the previous behavior before Slurm 22.05" (src/srun/opt.c's
    /// environment table). 22.05 through 23.02 read only `SRUN_CPUS_PER_TASK`
    /// (22.05 RELEASE_NOTES), so a step without `--cpus-per-task` gets 1 CPU
    /// per task. The same fact as `batch_lint::SRUN_INHERITS_CPUS_SINCE` and
    /// `task_plan::rdzv`'s warning.
    SrunReadsSlurmCpusPerTask,
}

impl Feature {
    /// The first release that has it.
    pub fn since(self) -> Release {
        FEATURES.iter().find(|(f, _, _)| *f == self).map_or(R22_05, |(_, since, _)| *since)
    }
}

/// When each [`Feature`] is there: `(feature, since, until)`, `until` the
/// last series that has it (`None`: still there in the newest release read).
pub const FEATURES: &[(Feature, Release, Option<Release>)] = &[
    (Feature::CreatesOutputDirs, R23_02, None),
    (Feature::SacctStdPaths, R24_05, None),
    (Feature::SacctExpandWithoutSlash, R24_05, Some(R25_05)),
    (Feature::DataParserV0042, R24_11, Some(R26_05)),
    (Feature::SubmitLine, R25_11, None),
    (Feature::ExpeditedRequeue, R25_11, None),
    (Feature::TopologyReasons, R26_05, None),
    (Feature::SrunReadsSlurmCpusPerTask, R23_11, None),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_and_compare() {
        assert_eq!(Release::from_version_number(0x16_05_08), Release::new(22, 5, 8));
        assert_eq!(Release::from_version_number(0x1a_05_05), Release::new(26, 5, 5));
        assert_eq!(Release::from_version_output("slurm 24.11.5\n"), Some(Release::new(24, 11, 5)));
        assert_eq!(Release::from_version_output("slurm-wlm 22.05.8\n"), Some(Release::new(22, 5, 8)));
        assert_eq!(Release::from_version_output("slurm 25.11.0-0rc1"), Some(Release::new(25, 11, 0)));
        assert_eq!(Release::from_version_output("slurm 26.05"), Some(Release::new(26, 5, 0)));
        assert_eq!(Release::from_version_output("scontrol: fatal: no config"), None);
        assert_eq!(Release::from_version_output(""), None);
        assert_eq!(Release::new(24, 11, 5).to_string(), "24.11.5");
        assert_eq!(Release::new(22, 5, 8).to_string(), "22.05.8");
        assert!(Release::new(23, 2, 2) < R23_02_3 && R23_02_3 < R23_11);
        let built = Release::new(24, 11, 0);
        assert_eq!(Release::pick(Some(Release::new(24, 11, 5)), built), Release::new(24, 11, 5));
        assert_eq!(Release::pick(None, built), built);
    }

    #[test]
    fn features_per_release() {
        let r = |s: &str| Release::from_version_output(&format!("slurm {s}")).unwrap_or(R22_05);
        assert!(!r("22.05.8").has(Feature::CreatesOutputDirs));
        assert!(r("23.02.0").has(Feature::CreatesOutputDirs) && r("26.05.5").has(Feature::CreatesOutputDirs));
        assert_eq!(r("24.05.8").json_parser(), None);
        assert_eq!(r("24.11.5").json_parser(), Some("v0.0.42"));
        assert_eq!(r("26.05.5").json_parser(), Some("v0.0.42"));
        assert_eq!(r("26.11.0").json_parser(), None);
        assert!(r("25.05.8").has(Feature::SacctExpandWithoutSlash));
        assert!(!r("25.11.0").has(Feature::SacctExpandWithoutSlash));
        assert!(!r("23.11.11").has(Feature::SacctStdPaths) && r("24.05.0").has(Feature::SacctStdPaths));
        assert!(!r("25.05.8").has(Feature::ExpeditedRequeue) && r("25.11.0").has(Feature::ExpeditedRequeue));
        assert!(!r("25.11.7").has(Feature::TopologyReasons) && r("26.05.0").has(Feature::TopologyReasons));
        assert!(!r("24.11.5").has(Feature::SubmitLine) && r("26.05.5").has(Feature::SubmitLine));
        assert_eq!(Feature::ExpeditedRequeue.since(), R25_11);
        assert!(
            !r("23.02.8").has(Feature::SrunReadsSlurmCpusPerTask)
                && r("23.11.0").has(Feature::SrunReadsSlurmCpusPerTask)
        );
    }
}
