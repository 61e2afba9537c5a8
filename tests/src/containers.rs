//! Containers in the lab (issue 29): pyxis and enroot, built from the
//! project's third-party snapshots, and the small images the lab makes itself.
//!
//! The sources are the tarballs in `../shared/third-party/` next to the
//! project's root ([`third_party_dir`]; its README has the recipe), never
//! copied into the project: [`Tools::ensure`] builds them into a cache of
//! their own ([`CONTAINERS_DIR`], or `$SLURM_LAB_CONTAINERS`), in a directory
//! named by a hash of the two tarballs and the recipe, made in a temporary
//! directory (enroot, whose scripts hold their install path, in place, the
//! stamp written last). enroot is built with Debian's
//! `libbsd-dev libmd-dev makeself` instead of its git submodules
//! (`make -o deps FORCE_GLIBC=1 LDLIBS="-l:libbsd.a -l:libmd.a" install`);
//! pyxis with `make` against `libslurm-dev`.
//!
//! [`Images::ensure`] makes the images: a Debian minbase root with python3
//! (the same `debootstrap` as the release roots), squashed with
//! `mksquashfs`, once as it is (`plain.sqsh`) and once with
//! `PYTORCH_VERSION=` in its `/etc/environment` (`pytorch.sqsh`: enroot
//! reads an image's environment there, and pyxis and enroot's PyTorch hook
//! take such an image for NVIDIA's PyTorch image). Cached like the release
//! roots: made again when older than [`crate::release::MAX_AGE`] or made by
//! another recipe.
//!
//! A lab with [`LabConfig::containers`] set lists pyxis in `plugstack.conf`
//! before or after spank_gpu ([`Lab::set_container_order`]), gives enroot a
//! configuration directory of its own (`<lab>/etc/enroot`, bind-mounted over
//! the cached build's in each node's mount namespace) whose `hooks.d` holds
//! enroot's `50-slurm-pytorch.sh` or not ([`Lab::set_pytorch_hook`]), and
//! whose `enroot.conf` gives each node its own runtime, data and cache
//! directories (the nodes share one file system: the second node's
//! `enroot create` of `pyxis_JOB.STEP` would fail with `File already exists`)
//! and lets root keep its privileges (the lab's jobs run as root; pyxis also
//! wants `ENROOT_ALLOW_SUPERUSER=y` in the job's environment). slurmd's
//! `PATH` starts with enroot's `bin`: pyxis runs `enroot` from slurmstepd's
//! `PATH`.

use crate::*;

use std::time::SystemTime;

/// Where pyxis, enroot and the images are cached unless `$SLURM_LAB_CONTAINERS` says otherwise.
pub const CONTAINERS_DIR: &str = "/var/cache/slurm-lab/containers";
/// The recipe the cached builds were made with: a new one makes them again.
const TOOLS_RECIPE: &str =
    "tools 1: enroot make -o deps FORCE_GLIBC=1 LDLIBS=-l:libbsd.a -l:libmd.a; pyxis make";
/// What the images hold beyond minbase, and how they are made.
const IMAGE_SUITE: &str = "bookworm";
const IMAGE_PACKAGES: &[&str] = &["python3"];
const IMAGE_RECIPE: &str = "images 1: minbase+python3, docs/locales/apt lists removed, mksquashfs -comp zstd";
/// The PyTorch version the "PyTorch image" claims (only its presence matters).
pub const PYTORCH_VERSION: &str = "2.5.0a0+lab";
/// The file in a cache directory that records how it was made.
const STAMP: &str = ".slurm-lab-stamp";

pub(crate) fn cache_dir() -> PathBuf {
    std::env::var_os("SLURM_LAB_CONTAINERS").map_or_else(|| PathBuf::from(CONTAINERS_DIR), PathBuf::from)
}

/// The project's root (the workspace this crate is part of).
fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Where the third-party tarballs are: `$SLURM_LAB_THIRD_PARTY`, else
/// `../shared/third-party` from the project's root, else (in a git worktree,
/// whose root is elsewhere) the same beside the main checkout. `None` when
/// none of them holds the tarballs (a plain clone): the container cases then
/// report themselves as not run.
pub fn third_party_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SLURM_LAB_THIRD_PARTY") {
        let dir = PathBuf::from(dir);
        return Tarballs::find(&dir).map(|_| dir);
    }
    let root = project_root();
    let mut candidates = vec![root.join("../shared/third-party")];
    // A worktree's `.git` is a file: `gitdir: MAIN/.git/worktrees/NAME`.
    if let Ok(text) = fs::read_to_string(root.join(".git")) {
        if let Some(gitdir) = text.trim().strip_prefix("gitdir:") {
            let gitdir = Path::new(gitdir.trim());
            if let Some(main) = gitdir.ancestors().find(|a| a.ends_with(".git")).and_then(Path::parent) {
                candidates.push(main.join("../shared/third-party"));
            }
        }
    }
    candidates.into_iter().find(|d| Tarballs::find(d).is_some())
}

/// The two tarballs.
#[derive(Clone, Debug)]
struct Tarballs {
    pyxis: PathBuf,
    enroot: PathBuf,
}

impl Tarballs {
    fn find(dir: &Path) -> Option<Tarballs> {
        let mut pyxis = None;
        let mut enroot = None;
        for entry in fs::read_dir(dir).ok()?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".tar.gz") {
                continue;
            }
            if name.starts_with("pyxis-") {
                pyxis = Some(entry.path());
            } else if name.starts_with("enroot-") {
                enroot = Some(entry.path());
            }
        }
        Some(Tarballs { pyxis: pyxis?, enroot: enroot? })
    }
}

/// The sha256 of some files and words, in hex (`sha256sum`).
fn sha256(files: &[&Path], words: &str) -> Result<String> {
    let mut text = String::new();
    for f in files {
        let out = run(Command::new("sha256sum").arg(f))?;
        text.push_str(String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or(""));
        text.push('\n');
    }
    text.push_str(words);
    let mut child = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    child.stdin.take().map(|mut s| s.write_all(text.as_bytes())).transpose()?;
    let out = child.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or("").to_owned())
}

/// Runs `cmd`, failing with the tail of its output (named by `what`).
fn build_step(what: &str, cmd: &mut Command) -> Result<()> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| LabError(format!("{what}: {e}")))?;
    if !out.status.success() {
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let lines: Vec<&str> = text.lines().collect();
        return err(format!(
            "{what} failed ({}):\n{}",
            out.status,
            lines[lines.len().saturating_sub(12)..].join("\n")
        ));
    }
    Ok(())
}

/// pyxis and enroot, built.
#[derive(Clone, Debug)]
pub struct Tools {
    /// `spank_pyxis.so`.
    pub pyxis: PathBuf,
    /// enroot's install prefix: `bin/enroot`, `etc/enroot`, `share/enroot/hooks.d`.
    pub enroot: PathBuf,
    /// The images.
    pub images: Images,
}

/// The lab's two images.
#[derive(Clone, Debug)]
pub struct Images {
    /// Debian minbase with python3.
    pub plain: PathBuf,
    /// The same with `PYTORCH_VERSION=` in its `/etc/environment`.
    pub pytorch: PathBuf,
}

impl Tools {
    /// pyxis, enroot and the images, built or made where the cache lacks
    /// them; `Ok(None)` when the third-party tarballs are absent.
    ///
    /// # Errors
    /// A build failed (the tail of its output), or a build tool is missing.
    pub fn ensure() -> Result<Option<Tools>> {
        let Some(dir) = third_party_dir() else { return Ok(None) };
        let Some(tarballs) = Tarballs::find(&dir) else { return Ok(None) };
        let missing: Vec<&str> =
            ["make", "cc", "mksquashfs", "jq", "parallel", "zstd", "makeself", "sha256sum", "unsquashfs"]
                .into_iter()
                .filter(|t| !which(t))
                .collect();
        if !missing.is_empty() {
            return err(format!(
                "missing tools for the container cases: {} (apt-get install squashfs-tools jq parallel zstd pigz \
                 makeself libbsd-dev libmd-dev, or run tests/run, which installs them)",
                missing.join(", ")
            ));
        }
        let key = sha256(&[&tarballs.pyxis, &tarballs.enroot], TOOLS_RECIPE)?;
        let path = cache_dir().join(format!("tools-{}", &key[..16]));
        if !path.join(STAMP).is_file() {
            build_tools(&tarballs, &path)?;
        }
        let images = Images::ensure()?;
        Ok(Some(Tools { pyxis: path.join("pyxis/spank_pyxis.so"), enroot: path.join("enroot"), images }))
    }

    /// The same tools with pyxis built for `release`: against the headers of
    /// its Debian root (pyxis is a SPANK plugin: Slurm loads only one built for
    /// its own release), cached beside the host's build as
    /// `pyxis-RELEASE/spank_pyxis.so`. The host's release keeps the host's build.
    ///
    /// # Errors
    /// The root could not be made, or pyxis's make failed.
    pub fn for_release(self, release: Release) -> Result<Tools> {
        let Some(root) = Root::ensure(release)? else { return Ok(self) };
        let tools = self.pyxis.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
        let dir = tools.join(format!("pyxis-{release}"));
        let so = dir.join("spank_pyxis.so");
        // Built for this root's headers: its stamp names its packages and slurmd.
        let made_for = fs::read_to_string(root.path.join(".slurm-lab-root")).unwrap_or_default();
        if so.is_file() && fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == made_for) {
            return Ok(Tools { pyxis: so, ..self });
        }
        let Some(tarballs) = third_party_dir().as_deref().and_then(Tarballs::find) else {
            return err("the third-party tarballs are gone");
        };
        let tmp = cache_dir().join(format!(".pyxis-{release}.{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let result = (|| -> Result<()> {
            fs::create_dir_all(&tmp)?;
            build_step(
                &format!("tar {}", tarballs.pyxis.display()),
                Command::new("tar")
                    .arg("-xzf")
                    .arg(&tarballs.pyxis)
                    .arg("-C")
                    .arg(&tmp)
                    .arg("--strip-components=1"),
            )?;
            // Only the root's Slurm headers (its C library's are not the host compiler's), through
            // the environment: the Makefile adds its own flags to it, a command-line value replaces them.
            let include = tmp.join("slurm-include");
            fs::create_dir_all(&include)?;
            std::os::unix::fs::symlink(root.include_dir().join("slurm"), include.join("slurm"))?;
            build_step(
                &format!("pyxis's make against Slurm {release}'s headers"),
                Command::new("make").current_dir(&tmp).env("CPPFLAGS", format!("-I{}", include.display())),
            )?;
            fs::create_dir_all(&dir)?;
            fs::copy(tmp.join("spank_pyxis.so"), dir.join(".spank_pyxis.so"))?;
            fs::rename(dir.join(".spank_pyxis.so"), &so)?;
            fs::write(dir.join(STAMP), &made_for)?;
            Ok(())
        })();
        let _ = fs::remove_dir_all(&tmp);
        result?;
        eprintln!("slurm-lab: pyxis built for Slurm {release}: {}", so.display());
        Ok(Tools { pyxis: so, ..self })
    }

    /// enroot's PyTorch hook, as built (what sites copy into `hooks.d`).
    pub fn pytorch_hook(&self) -> PathBuf {
        self.enroot.join("share/enroot/hooks.d/50-slurm-pytorch.sh")
    }
}

fn build_tools(tarballs: &Tarballs, path: &Path) -> Result<()> {
    let started = Instant::now();
    let parent = cache_dir();
    fs::create_dir_all(&parent)?;
    let tmp = parent.join(format!(".tools.{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    // enroot's scripts hold the paths of its install (its prefix), so it is installed in
    // place: the stamp, written last, says the build is whole.
    let _ = fs::remove_dir_all(path);
    let result = (|| -> Result<()> {
        for (name, tarball) in [("pyxis", &tarballs.pyxis), ("enroot", &tarballs.enroot)] {
            let src = tmp.join(format!("src/{name}"));
            fs::create_dir_all(&src)?;
            build_step(
                &format!("tar {}", tarball.display()),
                Command::new("tar").arg("-xzf").arg(tarball).arg("-C").arg(&src).arg("--strip-components=1"),
            )?;
        }
        // enroot's Makefile installs deps/dist/makeself/bin/enroot-makeself, which its
        // submodules would build: Debian's makeself is the same script.
        let enroot_src = tmp.join("src/enroot");
        let makeself = enroot_src.join("deps/dist/makeself/bin");
        fs::create_dir_all(&makeself)?;
        fs::copy("/usr/bin/makeself", makeself.join("enroot-makeself"))?;
        build_step(
            "enroot's make install",
            Command::new("make")
                .current_dir(&enroot_src)
                .args(["-o", "deps", "FORCE_GLIBC=1", "LDLIBS=-l:libbsd.a -l:libmd.a", "install"])
                .arg(format!("prefix={}", path.join("enroot").display())),
        )?;
        build_step("pyxis's make", Command::new("make").current_dir(tmp.join("src/pyxis")))?;
        fs::create_dir_all(path.join("pyxis"))?;
        fs::copy(tmp.join("src/pyxis/spank_pyxis.so"), path.join("pyxis/spank_pyxis.so"))?;
        // Written last: a build cut short has none, and is made again.
        fs::write(path.join(STAMP), format!("{TOOLS_RECIPE}\n"))?;
        Ok(())
    })();
    let _ = fs::remove_dir_all(&tmp);
    if let Err(e) = result {
        let _ = fs::remove_dir_all(path);
        return Err(e);
    }
    eprintln!(
        "slurm-lab: pyxis and enroot built in {:.1} s: {}",
        started.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(())
}

impl Images {
    /// The images, made when the cache lacks them or they are stale.
    ///
    /// # Errors
    /// debootstrap or mksquashfs failed.
    pub fn ensure() -> Result<Images> {
        let dir = cache_dir().join("images");
        let stamp = format!("{IMAGE_RECIPE}\nsuite {IMAGE_SUITE}\npackages {}\n", IMAGE_PACKAGES.join(","));
        let images = Images { plain: dir.join("plain.sqsh"), pytorch: dir.join("pytorch.sqsh") };
        let fresh = fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp)
            && fs::metadata(dir.join(STAMP))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age < release::MAX_AGE)
            && images.plain.is_file()
            && images.pytorch.is_file();
        if fresh {
            return Ok(images);
        }
        let started = Instant::now();
        let parent = cache_dir();
        fs::create_dir_all(&parent)?;
        let tmp = parent.join(format!(".images.{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let result = (|| -> Result<()> {
            let rootfs = tmp.join("rootfs");
            release::debootstrap(IMAGE_SUITE, IMAGE_PACKAGES, &rootfs)?;
            // What a container never reads: a smaller image squashes and unpacks faster.
            for sub in
                ["var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/locale", "usr/share/man"]
            {
                let d = rootfs.join(sub);
                if d.is_dir() {
                    fs::remove_dir_all(&d)?;
                    fs::create_dir_all(&d)?;
                }
            }
            let squash = |out: &Path| {
                build_step(
                    "mksquashfs",
                    Command::new("mksquashfs").arg(&rootfs).arg(out).args([
                        "-noappend",
                        "-quiet",
                        "-comp",
                        "zstd",
                    ]),
                )
            };
            squash(&tmp.join("plain.sqsh"))?;
            let env = rootfs.join("etc/environment");
            let mut text = fs::read_to_string(&env).unwrap_or_default();
            let _ = writeln!(text, "PYTORCH_VERSION={PYTORCH_VERSION}");
            fs::write(&env, text)?;
            squash(&tmp.join("pytorch.sqsh"))?;
            fs::remove_dir_all(&rootfs)?;
            fs::write(tmp.join(STAMP), &stamp)?;
            Ok(())
        })();
        if let Err(e) = result {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::rename(&tmp, &dir)?;
        eprintln!(
            "slurm-lab: container images made in {:.1} s: {}",
            started.elapsed().as_secs_f64(),
            dir.display()
        );
        Ok(images)
    }
}

/// Where pyxis goes in `plugstack.conf`, relative to spank_gpu.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// spank_gpu's line first: its hooks run before pyxis's.
    GpuFirst,
    /// pyxis's line first (what a `plugstack.conf.d/` glob gives for `pyxis.conf`
    /// before `spank-gpu.conf`).
    PyxisFirst,
}

impl Order {
    /// Both, in the order the cases try them.
    pub const ALL: [Order; 2] = [Order::GpuFirst, Order::PyxisFirst];

    /// Short name for tables: `gpu,pyxis` or `pyxis,gpu`.
    pub fn name(self) -> &'static str {
        match self {
            Order::GpuFirst => "gpu,pyxis",
            Order::PyxisFirst => "pyxis,gpu",
        }
    }
}

/// A lab's containers: the tools and the current configuration.
#[derive(Clone, Debug)]
pub struct ContainerConfig {
    /// pyxis, enroot and the images.
    pub tools: Tools,
    /// pyxis's place in `plugstack.conf`.
    pub order: Order,
    /// enroot's `50-slurm-pytorch.sh` in `hooks.d`.
    pub pytorch_hook: bool,
}

impl Lab {
    /// The lab's containers, when it has them.
    pub fn containers(&self) -> Option<&ContainerConfig> {
        self.cfg.containers.as_ref()
    }

    /// enroot's configuration directory of this lab (each node sees it at the
    /// cached build's `etc/enroot`).
    pub fn enroot_etc(&self) -> PathBuf {
        self.dir.join("etc/enroot")
    }

    /// pyxis's `runtime_path` (each node has its own behind it).
    fn pyxis_runtime(&self) -> PathBuf {
        self.dir.join("pyxis")
    }

    /// The plugstack line of pyxis, when the lab has containers.
    pub(crate) fn pyxis_line(&self) -> Option<String> {
        let c = self.cfg.containers.as_ref()?;
        Some(format!(
            "required {} runtime_path={}\n",
            c.tools.pyxis.display(),
            self.pyxis_runtime().display()
        ))
    }

    /// Writes enroot's configuration directory: the build's, with the lab's
    /// `enroot.conf` and the hook as configured.
    pub(crate) fn write_enroot_conf(&self) -> Result<()> {
        let Some(c) = self.cfg.containers.clone() else { return Ok(()) };
        let etc = self.enroot_etc();
        let _ = fs::remove_dir_all(&etc);
        run(Command::new("cp").arg("-a").arg(c.tools.enroot.join("etc/enroot")).arg(&etc))?;
        let d = self.dir.display();
        fs::write(
            etc.join("enroot.conf"),
            format!(
                "# The lab's nodes share one file system: each its own directories.\n\
                 ENROOT_RUNTIME_PATH {d}/nodes/$(hostname)/enroot/runtime\n\
                 ENROOT_DATA_PATH {d}/nodes/$(hostname)/enroot/data\n\
                 ENROOT_CACHE_PATH {d}/nodes/$(hostname)/enroot/cache\n\
                 ENROOT_TEMP_PATH {d}/nodes/$(hostname)/tmp\n\
                 # The lab's jobs run as root.\n\
                 ENROOT_ALLOW_SUPERUSER yes\n\
                 ENROOT_SQUASH_OPTIONS -comp zstd\n"
            ),
        )?;
        for node in &self.nodes {
            fs::create_dir_all(self.dir.join(format!("nodes/{node}/pyxis")))?;
        }
        fs::create_dir_all(self.pyxis_runtime())?;
        self.set_pytorch_hook(c.pytorch_hook)
    }

    /// Puts enroot's `50-slurm-pytorch.sh` in the lab's `hooks.d`, or takes it
    /// out (enroot reads `hooks.d` at every container start).
    ///
    /// # Errors
    /// The lab has no containers, or the file cannot be written.
    pub fn set_pytorch_hook(&self, on: bool) -> Result<()> {
        let Some(c) = self.cfg.containers.as_ref() else { return err("the lab has no containers") };
        let target = self.enroot_etc().join("hooks.d/50-slurm-pytorch.sh");
        if on {
            fs::copy(c.tools.pytorch_hook(), &target)?;
            fs::set_permissions(&target, fs::Permissions::from_mode(0o755))?;
        } else if target.exists() {
            fs::remove_file(&target)?;
        }
        Ok(())
    }

    /// Puts pyxis before or after spank_gpu in `plugstack.conf`, with these
    /// words on spank_gpu's line (as [`Lab::set_plugstack_args`]).
    ///
    /// # Errors
    /// The lab has no containers, or the file cannot be written.
    pub fn set_container_order(&mut self, order: Order, args: &[&str]) -> Result<()> {
        let Some(c) = self.cfg.containers.as_mut() else { return err("the lab has no containers") };
        c.order = order;
        self.set_plugstack_args(args)
    }

    /// The shell words a node's slurmd starts after: enroot on its `PATH`,
    /// its own enroot configuration and pyxis runtime directory.
    /// On a release's root the same mounts are made at the root's paths (the
    /// cache, where the tools and images are, is mounted in the root read-only:
    /// [`Lab::container_dirs`]).
    pub(crate) fn container_mounts(&self, node: &str) -> String {
        let Some(c) = self.cfg.containers.as_ref() else { return String::new() };
        let mut binds = vec![
            (self.enroot_etc(), c.tools.enroot.join("etc/enroot")),
            (self.dir.join(format!("nodes/{node}/pyxis")), self.pyxis_runtime()),
        ];
        if let Some(root) = &self.root {
            binds = binds.into_iter().map(|(from, to)| (from, root.inside(&to))).collect();
        }
        let mut script = String::new();
        for (from, to) in binds {
            let _ = write!(script, "mount --bind {} {} && ", from.display(), to.display());
        }
        let _ = write!(script, "export PATH={}:$PATH && ", c.tools.enroot.join("bin").display());
        script
    }

    /// What a release's root needs mounted for containers: the cache of the
    /// tools and images, read-only.
    pub(crate) fn container_dirs(&self) -> Vec<PathBuf> {
        if self.cfg.containers.is_some() { vec![cache_dir()] } else { Vec::new() }
    }
}
