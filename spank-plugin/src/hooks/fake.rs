//! A fake SPANK handle: a few maps, a log and the task's stderr.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use std::io;

use super::*;
use crate::spank::SpankError;
use slurm_formats::cpuset::CpuSet;
use task_plan::rdzv::container::{MountNs, PyxisOption};

/// The host's mount namespace, where slurmstepd runs.
pub const HOST_MOUNT_NS: MountNs = MountNs { dev: 4, ino: 4_026_531_841 };
/// A container's mount namespace, which pyxis's `task_init` enters.
pub const CONTAINER_MOUNT_NS: MountNs = MountNs { dev: 4, ino: 4_026_532_900 };

#[derive(Debug)]
pub struct FakeSpank {
    pub context: Context,
    pub registered: Vec<UserOption>,
    pub refuse_register: bool,
    pub options: BTreeMap<&'static str, String>,
    pub items: BTreeMap<&'static str, u32>,
    pub env: BTreeMap<String, String>,
    pub log: RefCell<Vec<(Level, String)>>,
    pub stderr: RefCell<Vec<String>>,
    /// How long the hooks paused in all (`Spank::pause`), without sleeping.
    pub paused: std::cell::Cell<std::time::Duration>,
    pub port_taken: Option<String>,
    pub sysctls: BTreeMap<&'static str, String>,
    pub files: BTreeMap<String, String>,
    pub mask: CpuSet,
    /// The task's cpuset, where it is narrower than its mask: what
    /// `set_affinity` keeps of a mask, as the kernel does.
    pub cpuset: Option<CpuSet>,
    pub mem_nodes: Vec<u32>,
    /// What the task's device cgroup answers per device file of the host;
    /// absent: cannot tell. A probe relative to the opened device directory
    /// (`device_access_at`) always finds these.
    pub devices: BTreeMap<String, task_plan::devices::Access>,
    /// What a probe by path finds once a container plugin (pyxis, listed
    /// first) has moved the task into the container's mount namespace, whose
    /// `/dev` is not the host's; `None`: the task is in the host's, and a
    /// path finds `devices`.
    pub container_devices: Option<BTreeMap<String, task_plan::devices::Access>>,
    /// slurmstepd's own environment (slurmd's), not the job's.
    pub process_env: BTreeMap<&'static str, String>,
    /// The step's command line (`S_JOB_ARGV`).
    pub command: Vec<String>,
    /// What slurmctld answers for the step's layout (srun): each node's first task.
    pub layout: Result<Vec<u32>, String>,
    /// How many times the step's layout was asked for (RPCs to slurmctld).
    pub layout_asked: std::cell::Cell<u32>,
    /// srun's topology settings (`slurm_conf`): flat, by default.
    pub topology: task_plan::layout::TopologyConf,
    /// slurmstepd's configuration (`slurm_conf`); `None`: not loaded, so
    /// whether devices are constrained cannot be told.
    pub stepd_conf: Option<crate::spank::StepdConf>,
    /// How many device files the task probed (`device_access`, `device_access_at`).
    pub probes: std::cell::Cell<u32>,
    /// Other plugins' options given to the step, by name (pyxis's
    /// `container-image`...), as slurmstepd's option cache answers them.
    pub foreign_options: BTreeMap<&'static str, String>,
    /// The calling process's mount namespace now: slurmstepd's in
    /// `user_init`; a test that runs pyxis's `task_init` first (pyxis
    /// listed first) changes it before `task_init`, as pyxis's `setns`.
    pub mount_ns: MountNs,
    /// The node's network interfaces (`getifaddrs`): `lo` and `eth0` unless
    /// a test gives others.
    pub interfaces: Vec<task_plan::netif::Interface>,
    /// The passwd database's home directories, by uid.
    pub homes: BTreeMap<u32, String>,
    /// The user's files, read as the user (`~/.nccl.conf`).
    pub user_files: BTreeMap<String, String>,
    /// The user's files read, in order.
    pub user_reads: RefCell<Vec<String>>,
    /// The seams that fail: a call's name (`set_affinity`, `affinity`,
    /// `prefer_memory`, `setenv`, `unsetenv`, `getenv`, `option_arg`, `srun_env`,
    /// `read_trusted`, `command`, `probe_port`, `step_first_tasks`, `srun_topology`,
    /// `open_dev_dir`, `foreign_option`, `mount_ns`, `interfaces`,
    /// `user_home`, `read_user_file`), or
    /// `CALL:ARG` for one argument only (`item:TaskId`, `setenv:RANK`,
    /// `getenv:SLURM_STEP_GPUS`, `option_arg:gpu-affinity`,
    /// `foreign_option:container-image`).
    pub fail: BTreeSet<String>,
}

impl FakeSpank {
    pub fn new(context: Context) -> FakeSpank {
        FakeSpank {
            context,
            registered: Vec::new(),
            refuse_register: false,
            options: BTreeMap::new(),
            items: BTreeMap::new(),
            env: BTreeMap::new(),
            log: RefCell::new(Vec::new()),
            stderr: RefCell::new(Vec::new()),
            paused: std::cell::Cell::new(std::time::Duration::ZERO),
            port_taken: None,
            sysctls: BTreeMap::new(),
            files: BTreeMap::new(),
            mask: CpuSet::parse("0-15").unwrap_or_default(),
            cpuset: None,
            mem_nodes: Vec::new(),
            devices: BTreeMap::new(),
            container_devices: None,
            process_env: BTreeMap::new(),
            command: Vec::new(),
            layout: Err("no layout in this fake".into()),
            layout_asked: std::cell::Cell::new(0),
            topology: task_plan::layout::TopologyConf {
                plugin: "topology/flat".into(),
                ..Default::default()
            },
            stepd_conf: None,
            probes: std::cell::Cell::new(0),
            foreign_options: BTreeMap::new(),
            mount_ns: HOST_MOUNT_NS,
            interfaces: fake_node(&["lo URL 127.0.0.1/8", "eth0 UR 10.0.0.1/24"]),
            homes: BTreeMap::from([(1000, "/home/u".to_owned())]),
            user_files: BTreeMap::new(),
            user_reads: RefCell::new(Vec::new()),
            fail: BTreeSet::new(),
        }
    }

    /// Task `global` (local `local`) of a 2-node, 4-task step of job 77 on node `node`.
    pub fn task(node: u32, local: u32, global: u32) -> FakeSpank {
        let mut sp = FakeSpank::new(Context::Remote);
        for (k, v) in [
            ("JobId", 77),
            ("StepId", 0),
            ("NNodes", 2),
            ("NodeId", node),
            ("LocalTaskCount", 2),
            ("TotalTaskCount", 4),
            ("StepCpusPerTask", 4),
            ("TaskId", local),
            ("TaskGlobalId", global),
            ("JobUid", 1000),
        ] {
            sp.items.insert(k, v);
        }
        sp.env.insert("SLURM_STEP_NODELIST".into(), "node[1-2]".into());
        sp.env.insert("CUDA_VISIBLE_DEVICES".into(), local.to_string());
        sp
    }

    pub fn errors(&self) -> Vec<String> {
        self.log.borrow().iter().filter(|(l, _)| *l == Level::Error).map(|(_, m)| m.clone()).collect()
    }

    pub fn var(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(String::as_str)
    }

    /// Makes `seam` fail from now on (see [`FakeSpank::fail`]).
    pub fn failing(mut self, seam: &str) -> FakeSpank {
        self.fail.insert(seam.to_owned());
        self
    }

    /// Whether the call `call` with `arg` fails.
    fn fails(&self, call: &str, arg: &str) -> bool {
        self.fail.contains(call) || self.fail.contains(&format!("{call}:{arg}"))
    }

    fn spank_error(call: &'static str) -> SpankError {
        SpankError { call, code: 3001, text: "Invalid argument".into() }
    }

    fn io_error(call: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{call}: Invalid argument (os error 22)"))
    }
}

impl Spank for FakeSpank {
    fn context(&self) -> Context {
        self.context
    }

    fn register_option(&mut self, option: UserOption) -> Result<(), SpankError> {
        if self.refuse_register {
            return Err(SpankError {
                call: "spank_option_register",
                code: 3001,
                text: "Invalid argument".into(),
            });
        }
        self.registered.push(option);
        Ok(())
    }

    fn option_arg(&self, option: UserOption) -> Result<Option<String>, SpankError> {
        if self.fails("option_arg", option.name()) {
            return Err(Self::spank_error("spank_option_getopt"));
        }
        Ok(self.options.get(option.name()).cloned())
    }

    fn foreign_option(&self, option: PyxisOption) -> Result<Option<String>, SpankError> {
        if self.fails("foreign_option", option.name) {
            return Err(Self::spank_error("spank_option_getopt"));
        }
        Ok(self.foreign_options.get(option.name).cloned())
    }

    fn setenv(&mut self, name: &str, value: &str, overwrite: bool) -> Result<bool, SpankError> {
        if self.fails("setenv", name) {
            return Err(Self::spank_error("spank_setenv"));
        }
        if !overwrite && self.env.contains_key(name) {
            return Ok(false);
        }
        self.env.insert(name.to_owned(), value.to_owned());
        Ok(true)
    }

    fn unsetenv(&mut self, name: &str) -> Result<(), SpankError> {
        if self.fails("unsetenv", name) {
            return Err(Self::spank_error("spank_unsetenv"));
        }
        self.env.remove(name);
        Ok(())
    }

    fn srun_env(&mut self, name: &str, value: Option<&str>) -> Result<(), io::Error> {
        assert_eq!(self.context, Context::Local, "srun's environment outside srun");
        if self.fails("srun_env", name) {
            return Err(Self::io_error("setenv"));
        }
        match value {
            Some(v) => self.env.insert(name.to_owned(), v.to_owned()),
            None => self.env.remove(name),
        };
        Ok(())
    }

    fn log(&self, level: Level, message: &str) {
        self.log.borrow_mut().push((level, message.to_owned()));
    }

    fn item(&self, item: Item) -> Result<u32, SpankError> {
        let key = format!("{item:?}");
        if self.fails("item", &key) {
            return Err(Self::spank_error("spank_get_item"));
        }
        self.items.get(key.as_str()).copied().ok_or(SpankError {
            call: "spank_get_item",
            code: 3001,
            text: "Invalid argument".into(),
        })
    }

    fn getenv(&self, name: &str) -> Result<Option<String>, SpankError> {
        // As Slurm: spank_getenv answers ESPANK_NOT_REMOTE outside slurmstepd.
        if self.context != Context::Remote {
            return Err(SpankError {
                call: "spank_getenv",
                code: 3006,
                text: "Valid only in remote context".into(),
            });
        }
        if self.fails("getenv", name) {
            return Err(Self::spank_error("spank_getenv"));
        }
        Ok(self.env.get(name).cloned())
    }

    fn task_stderr(&self, line: &str) {
        self.stderr.borrow_mut().push(line.to_owned());
    }

    fn pause(&self, how_long: std::time::Duration) {
        self.paused.set(self.paused.get() + how_long);
    }

    fn command(&self) -> Result<Vec<String>, SpankError> {
        if self.fails("command", "") {
            return Err(Self::spank_error("spank_get_item"));
        }
        Ok(self.command.clone())
    }

    fn step_first_tasks(&self, _job_id: u32, _step_id: u32) -> Result<Vec<u32>, String> {
        self.layout_asked.set(self.layout_asked.get() + 1);
        if self.fails("step_first_tasks", "") {
            return Err("slurm_job_step_layout_get: Invalid argument".into());
        }
        self.layout.clone()
    }

    fn srun_topology(&self) -> Result<task_plan::layout::TopologyConf, String> {
        if self.fails("srun_topology", "") {
            return Err("no slurm_conf in this process".into());
        }
        Ok(self.topology.clone())
    }

    fn stepd_conf(&self) -> Result<crate::spank::StepdConf, String> {
        if self.fails("stepd_conf", "") {
            return Err("no slurm_conf in this process".into());
        }
        self.stepd_conf.clone().ok_or_else(|| "slurmstepd's configuration is not loaded".into())
    }
}

impl Node for FakeSpank {
    /// The path the device directory was opened on.
    type DevDir = String;
    type RunDir = String;

    fn open_run_dir(&self, path: &str, _lock: bool) -> io::Result<String> {
        if self.fails("open_run_dir", path) {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{path}: not root's alone")));
        }
        Ok(path.trim_end_matches('/').to_owned())
    }

    /// `lock:DIR` in `fail`: another holds the directory's lock past the wait.
    fn run_dir_lock_missed(&self, dir: &String) -> bool {
        self.fail.contains(&format!("lock:{dir}"))
    }

    fn run_dir_names(&self, dir: &String) -> io::Result<Vec<String>> {
        if self.fails("run_dir_names", dir) {
            return Err(Self::io_error("readdir"));
        }
        let prefix = format!("{dir}/");
        Ok(self
            .files
            .keys()
            .filter_map(|f| f.strip_prefix(&prefix).filter(|n| !n.contains('/')).map(str::to_owned))
            .collect())
    }

    fn run_dir_read(&self, dir: &String, name: &str, _max_bytes: usize) -> io::Result<String> {
        let path = format!("{dir}/{name}");
        if self.fails("run_dir_read", &path) {
            return Err(Self::io_error(&path));
        }
        self.files.get(&path).cloned().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, path))
    }

    fn run_dir_write(&mut self, dir: &String, name: &str, text: &str) -> io::Result<()> {
        let path = format!("{dir}/{name}");
        if self.fails("run_dir_write", &path) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("{path}: No space left on device"),
            ));
        }
        self.files.insert(path, text.to_owned());
        Ok(())
    }

    fn run_dir_remove(&mut self, dir: &String, name: &str) -> io::Result<()> {
        let path = format!("{dir}/{name}");
        if self.fails("run_dir_remove", &path) {
            return Err(Self::io_error(&path));
        }
        self.files.remove(&path);
        Ok(())
    }

    fn probe_port(&self, _port: u16) -> io::Result<()> {
        if self.fails("probe_port", "") {
            return Err(Self::io_error("bind"));
        }
        self.port_taken.clone().map_or(Ok(()), |who| Err(io::Error::new(io::ErrorKind::AddrInUse, who)))
    }

    fn sysctl(&self, key: &'static str) -> Option<String> {
        self.sysctls.get(key).cloned()
    }

    fn read_trusted(&self, path: &str, _max_bytes: usize) -> io::Result<String> {
        if self.fails("read_trusted", path) {
            return Err(Self::io_error(path));
        }
        self.files.get(path).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{path}: No such file or directory"))
        })
    }

    fn dir_names(&self, dir: &str) -> io::Result<Vec<String>> {
        if self.fails("dir_names", dir) {
            return Err(Self::io_error("opendir"));
        }
        let prefix = format!("{}/", dir.trim_end_matches('/'));
        let names: Vec<String> = self
            .files
            .keys()
            .filter_map(|f| f.strip_prefix(&prefix).filter(|n| !n.contains('/')).map(str::to_owned))
            .collect();
        if names.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{dir}: No such file or directory")));
        }
        Ok(names)
    }

    fn process_env(&self, name: &'static str) -> Option<String> {
        self.process_env.get(name).cloned()
    }

    fn device_access(&self, path: &str) -> task_plan::devices::Access {
        self.probes.set(self.probes.get() + 1);
        let seen = self.container_devices.as_ref().unwrap_or(&self.devices);
        seen.get(path).copied().unwrap_or(task_plan::devices::Access::Unknown)
    }

    fn open_dev_dir(&self, path: &str) -> io::Result<String> {
        if self.fails("open_dev_dir", path) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{path}: No such file or directory"),
            ));
        }
        Ok(path.to_owned())
    }

    fn device_access_at(&self, dir: &String, name: &str) -> Option<task_plan::devices::Access> {
        self.probes.set(self.probes.get() + 1);
        // `failing("device_access_at")`: the descriptor no longer names the directory.
        if self.fails("device_access_at", "") {
            return None;
        }
        let path = format!("{}/{name}", dir.trim_end_matches('/'));
        Some(self.devices.get(&path).copied().unwrap_or(task_plan::devices::Access::Unknown))
    }

    fn mount_ns(&self) -> io::Result<MountNs> {
        if self.fails("mount_ns", "") {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "/proc/self/ns/mnt: No such file or directory (os error 2)",
            ));
        }
        Ok(self.mount_ns)
    }

    fn interfaces(&self) -> io::Result<Vec<task_plan::netif::Interface>> {
        if self.fails("interfaces", "") {
            return Err(Self::io_error("getifaddrs"));
        }
        Ok(self.interfaces.clone())
    }

    fn user_home(&self, uid: u32) -> io::Result<String> {
        if self.fails("user_home", "") {
            return Err(Self::io_error("getpwuid_r"));
        }
        self.homes
            .get(&uid)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("uid {uid} has no passwd entry")))
    }

    fn read_user_file(&self, path: &str, _max_bytes: usize, uid: u32) -> io::Result<String> {
        assert_eq!(self.context, Context::Remote, "the user's file outside a task");
        assert_eq!(Some(&uid), self.items.get("JobUid"), "read as another user than the job's");
        self.user_reads.borrow_mut().push(path.to_owned());
        if self.fails("read_user_file", path) {
            return Err(io::Error::other(format!("{path}: Permission denied (os error 13)")));
        }
        self.user_files.get(path).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{path}: No such file or directory"))
        })
    }

    fn affinity(&self) -> io::Result<CpuSet> {
        if self.fails("affinity", "") {
            return Err(Self::io_error("sched_getaffinity"));
        }
        Ok(self.mask.clone())
    }

    fn set_affinity(&mut self, cpus: &CpuSet) -> io::Result<()> {
        if self.fails("set_affinity", "") {
            return Err(Self::io_error("sched_setaffinity"));
        }
        // As the kernel: the mask keeps only the CPUs of the task's cpuset.
        self.mask = match &self.cpuset {
            Some(allowed) if !cpus.intersects(allowed) => return Err(Self::io_error("sched_setaffinity")),
            Some(allowed) => cpus.intersection(allowed),
            None => cpus.clone(),
        };
        Ok(())
    }

    fn prefer_memory(&mut self, nodes: &[u32]) -> io::Result<()> {
        if self.fails("prefer_memory", "") {
            return Err(Self::io_error("set_mempolicy"));
        }
        self.mem_nodes = nodes.to_vec();
        Ok(())
    }
}

/// Interfaces from `name flags addr/len ...`, flags from `U` (up), `R`
/// (running), `L` (loopback).
pub fn fake_node(specs: &[&str]) -> Vec<task_plan::netif::Interface> {
    specs
        .iter()
        .map(|spec| {
            let mut words = spec.split_whitespace();
            let name = words.next().unwrap_or_default().to_owned();
            let flags = words.next().unwrap_or_default();
            let addrs = words
                .filter_map(|w| {
                    let (ip, len) = w.split_once('/')?;
                    Some(task_plan::netif::Address { ip: ip.parse().ok()?, prefix: len.parse().ok()? })
                })
                .collect();
            task_plan::netif::Interface {
                name,
                up: flags.contains('U'),
                running: flags.contains('R'),
                loopback: flags.contains('L'),
                addrs,
            }
        })
        .collect()
}
