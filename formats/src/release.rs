//! Slurm releases: which one a plugin was built for, which one a node runs,
//! whether Slurm loads the one into the other, and which package fits.
//!
//! Slurm reads a plugin's `plugin_version` symbol (`SLURM_VERSION_NUMBER` of
//! the headers it was built against: `major << 16 | minor << 8 | micro`) and
//! loads a SPANK plugin only when major and minor match its own
//! (`src/common/plugin.c`, `_verify_syms`: "SPANK plugins need to only match
//! major and minor", mask `0xffff00`; the same at every release from 22.05 to
//! 26.05). Otherwise a `required` plugin stops slurmd and every job, and an
//! `optional` one is left out: the jobs run without it, and before 25.11.1
//! Slurm says `error: spank: PATH: Incompatible plugin version`; from 25.11.1
//! (commit a3663aab49, `src/common/spank.c` `_spank_plugin_create`) that line
//! is at verbose level for an `optional` plugin, and only an info-level
//! `plugin_load_from_file: Incompatible Slurm plugin PATH version (X.Y.Z)` is
//! left.

use std::fmt;

/// The bits of a version number a SPANK plugin must share with Slurm.
pub const SPANK_VERSION_MASK: u32 = 0x00ff_ff00;

/// A Slurm major.minor, as packages and users name it: `24.11`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    /// `24` of 24.11.
    pub major: u32,
    /// `11` of 24.11.
    pub minor: u32,
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:02}", self.major, self.minor)
    }
}

/// A full Slurm version: `24.11.5`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major and minor.
    pub release: Release,
    /// The maintenance release, `5` of 24.11.5.
    pub micro: u32,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.release, self.micro)
    }
}

impl Version {
    /// From `SLURM_VERSION_NUMBER` (what a plugin's `plugin_version` holds).
    pub fn from_number(n: u32) -> Version {
        Version { release: Release { major: (n >> 16) & 0xff, minor: (n >> 8) & 0xff }, micro: n & 0xff }
    }

    /// As `SLURM_VERSION_NUMBER`; `None` when a part does not fit its byte.
    pub fn number(self) -> Option<u32> {
        let Release { major, minor } = self.release;
        (major <= 0xff && minor <= 0xff && self.micro <= 0xff)
            .then_some(major << 16 | minor << 8 | self.micro)
    }

    /// The version in what `slurmd -V`, `srun --version` or `sinfo --version`
    /// print: `slurm-wlm 26.05.5` (Debian's packages), `slurm 24.11.5`
    /// (SchedMD's), `slurm 24.11.0-0rc1`. The first word that starts with a
    /// digit; the micro part is its leading digits.
    pub fn parse(text: &str) -> Option<Version> {
        let word = text.split_whitespace().find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
        let mut parts = word.splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let micro_text = parts.next()?;
        let digits = micro_text.find(|c: char| !c.is_ascii_digit()).unwrap_or(micro_text.len());
        let micro = micro_text[..digits].parse().ok()?;
        Some(Version { release: Release { major, minor }, micro })
    }
}

/// Whether Slurm of version number `slurm` loads a SPANK plugin whose
/// `plugin_version` is `plugin`.
pub fn spank_loads(plugin: u32, slurm: u32) -> bool {
    plugin & SPANK_VERSION_MASK == slurm & SPANK_VERSION_MASK
}

/// The package's name without its architecture, as `packaging/build.sh`
/// names the `.deb` for `release` (`spank-gpu_0.1.0-1+slurm26.05`).
pub fn deb_package(version: &str, release: Release) -> String {
    format!("spank-gpu_{version}-1+slurm{release}")
}

/// The same for the `.rpm` (`spank-gpu-0.1.0-1.slurm26.05`).
pub fn rpm_package(version: &str, release: Release) -> String {
    format!("spank-gpu-{version}-1.slurm{release}")
}

/// What to install for a node running `release`, in words.
pub fn install_advice(version: &str, release: Release) -> String {
    format!(
        "install {} (.deb) or {} (.rpm), built by `packaging/build.sh --slurm {release}`",
        deb_package(version, release),
        rpm_package(version, release)
    )
}

/// Slurm's plugin directories as the distributions' packages install it,
/// where `scontrol show config` cannot tell (`PluginDir` unset is Slurm's
/// compiled-in `$libdir/slurm`, which each packaging chooses):
/// `(whose packages, directory)`, for the machine's Debian multiarch triplet
/// (`x86_64-linux-gnu`).
pub fn default_plugin_dirs(triplet: &str) -> [(&'static str, String); 3] {
    [
        // Debian's slurm-wlm-basic-plugins (and every Debian suite's slurmd).
        ("Debian's slurm-wlm packages", format!("/usr/lib/{triplet}/slurm-wlm")),
        // SchedMD's debian/ (slurm-smd-*): dh_auto_configure's default --libdir,
        // and `rm -r debian/tmp/usr/lib/*/slurm/src` in its debian/rules.
        ("SchedMD's slurm-smd debs", format!("/usr/lib/{triplet}/slurm")),
        // SchedMD's slurm.spec: %{_libdir}/slurm/*.so.
        ("SchedMD's RPMs", "/usr/lib64/slurm".to_owned()),
    ]
}

/// The Debian multiarch triplet of this build's target (`x86_64-linux-gnu`);
/// `None` for an architecture this list does not know.
pub fn multiarch_triplet() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Some("x86_64-linux-gnu"),
        "aarch64" => Some("aarch64-linux-gnu"),
        "powerpc64" => Some("powerpc64le-linux-gnu"),
        "riscv64" => Some("riscv64-linux-gnu"),
        _ => None,
    }
}

/// The directories of `PluginDir = A:B` in `scontrol show config` output.
pub fn plugin_dirs_from_show_config(text: &str) -> Option<Vec<String>> {
    text.lines().find_map(|l| {
        let (key, value) = l.split_once('=')?;
        (key.trim() == "PluginDir")
            .then(|| value.trim().split(':').filter(|d| !d.is_empty()).map(str::to_owned).collect())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_every_command_and_number() {
        let v = |text| Version::parse(text).map(|v| v.to_string());
        assert_eq!(v("slurm-wlm 26.05.5\n").as_deref(), Some("26.05.5"));
        assert_eq!(v("slurm 24.11.5").as_deref(), Some("24.11.5"));
        assert_eq!(v("slurm 24.11.0-0rc1").as_deref(), Some("24.11.0"));
        assert_eq!(v("slurm-wlm 22.05.8"), Some("22.05.8".to_owned()));
        assert_eq!(v("slurmd: error: cannot read /etc/slurm/slurm.conf"), None);
        assert_eq!(v(""), None);
        assert_eq!(v("slurm 24"), None);
        let n = Version::parse("slurm-wlm 22.05.8").and_then(Version::number);
        assert_eq!(n, Some(0x16_0508));
        assert_eq!(Version::from_number(0x1a_0505).to_string(), "26.05.5");
        assert_eq!(Version::from_number(0x18_0b05).release.to_string(), "24.11");
        assert_eq!(Version::parse("slurm 24.300.1").and_then(Version::number), None);
    }

    #[test]
    fn spank_plugins_match_on_major_and_minor_only() {
        assert!(spank_loads(0x16_0508, 0x16_0502));
        assert!(!spank_loads(0x16_0508, 0x1a_0505));
        assert!(!spank_loads(0x18_0b05, 0x19_0b05));
        assert!(!spank_loads(0x18_0b05, 0x18_0505));
    }

    #[test]
    fn package_names_are_build_sh_s() {
        let r = Release { major: 26, minor: 5 };
        assert_eq!(deb_package("0.1.0", r), "spank-gpu_0.1.0-1+slurm26.05");
        assert_eq!(rpm_package("0.1.0", r), "spank-gpu-0.1.0-1.slurm26.05");
        assert!(install_advice("0.1.0", r).contains("--slurm 26.05"));
    }

    #[test]
    fn plugin_dirs() {
        let text = "Configuration data as of 2026-01-01T00:00:00\nPlugStackConfig         = (null)\n\
                    PluginDir               = /opt/slurm/lib/slurm:/usr/lib64/slurm\nPlugStackConfig = x\n";
        assert_eq!(
            plugin_dirs_from_show_config(text),
            Some(vec!["/opt/slurm/lib/slurm".to_owned(), "/usr/lib64/slurm".to_owned()])
        );
        assert_eq!(plugin_dirs_from_show_config("SlurmctldHost = a\n"), None);
        let dirs = default_plugin_dirs("x86_64-linux-gnu");
        assert_eq!(dirs[0].1, "/usr/lib/x86_64-linux-gnu/slurm-wlm");
        assert_eq!(dirs[1].1, "/usr/lib/x86_64-linux-gnu/slurm");
        assert_eq!(dirs[2].1, "/usr/lib64/slurm");
    }
}
