//! Apptainer in the lab (issue 29): the image the Apptainer cases run, as a
//! SIF built by the release root's own `apptainer`.
//!
//! Only Debian sid's root carries Apptainer (1.4.5; Debian 12 and 13 have
//! none: [`crate::release::extra_packages`]), so these cases run on the 26.05
//! lab. Its nodes enter their root by `pivot_root` (Apptainer refuses a
//! chroot, see `Lab::start_daemons`). The SIF is made from the lab's plain
//! container image (`containers::Images`: Debian minbase with python3),
//! unpacked and built with `apptainer build` on node1, then cached beside the
//! images and copied into each lab that uses it (the root sees the lab's
//! directory at its own path). The jobs run as root, which Apptainer lets
//! start containers here only with `--no-privs`: these machines' root lacks
//! `CAP_SYS_RESOURCE` ("Requesting capability set 0x1ffffffffff while
//! permitted capability set is 0x1fffeffffff").

use crate::*;

use crate::containers::{Images, cache_dir};

/// How the SIF is made: a new recipe makes it again.
const SIF_RECIPE: &str = "sif 1: unsquashfs plain.sqsh; apptainer build on node1";
const STAMP: &str = ".slurm-lab-stamp";

impl Lab {
    /// Whether this lab's nodes have `apptainer` (their root carries it).
    pub fn has_apptainer(&self) -> bool {
        self.root.as_ref().is_some_and(|r| r.inside(Path::new("/usr/bin/apptainer")).is_file())
    }

    /// The lab's copy of the Apptainer image (a SIF of Debian minbase with
    /// python3), built where the cache lacks it.
    ///
    /// # Errors
    /// The lab has no Apptainer, or the image could not be made.
    pub fn apptainer_image(&self) -> Result<PathBuf> {
        if !self.has_apptainer() {
            return err(
                "this lab's nodes have no apptainer (only Debian sid's root, Slurm 26.05, carries it)",
            );
        }
        let dir = cache_dir().join("sif");
        let cached = dir.join("plain.sif");
        let images = Images::ensure()?;
        let stamp = format!(
            "{SIF_RECIPE}\nfrom {}\n{}",
            fs::metadata(&images.plain)?.mtime(),
            String::from_utf8_lossy(&run(self.command_on("node1", "apptainer")?.arg("--version"))?.stdout)
        );
        let work = self.dir.join("apptainer");
        fs::create_dir_all(&work)?;
        let here = work.join("plain.sif");
        if fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp) && cached.is_file() {
            fs::copy(&cached, &here)?;
            return Ok(here);
        }
        let started = Instant::now();
        let rootfs = work.join("rootfs");
        let _ = fs::remove_dir_all(&rootfs);
        run(Command::new("unsquashfs").args(["-q", "-n", "-d"]).arg(&rootfs).arg(&images.plain))?;
        let out = self
            .command_on("node1", "apptainer")?
            .args(["--quiet", "build", "--force"])
            .arg(&here)
            .arg(&rootfs)
            .output()?;
        let _ = fs::remove_dir_all(&rootfs);
        if !out.status.success() {
            return err(format!(
                "apptainer build on node1 failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        // The stamp goes first and comes back last: a copy cut short is never taken for whole.
        fs::create_dir_all(&dir)?;
        let _ = fs::remove_file(dir.join(STAMP));
        let part = dir.join(".plain.sif.part");
        fs::copy(&here, &part)?;
        fs::rename(&part, &cached)?;
        fs::write(dir.join(STAMP), stamp)?;
        eprintln!(
            "slurm-lab: Apptainer image built in {:.1} s: {}",
            started.elapsed().as_secs_f64(),
            cached.display()
        );
        Ok(here)
    }
}
