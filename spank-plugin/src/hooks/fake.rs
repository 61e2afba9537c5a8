//! A fake SPANK handle: a few maps, a log and the task's stderr.

use std::cell::RefCell;
use std::collections::BTreeMap;

use std::io;

use super::*;
use crate::spank::SpankError;
use gpu_core::cpuset::CpuSet;

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
    pub port_taken: Option<String>,
    pub sysctls: BTreeMap<&'static str, String>,
    pub files: BTreeMap<String, String>,
    pub mask: CpuSet,
    pub mem_nodes: Vec<u32>,
    /// What the task's device cgroup answers per device file; absent: cannot tell.
    pub devices: BTreeMap<String, gpu_core::devices::Access>,
    /// slurmstepd's own environment (slurmd's), not the job's.
    pub stepd_env: BTreeMap<&'static str, String>,
    /// The step's command line (`S_JOB_ARGV`).
    pub command: Vec<String>,
    /// What slurmctld answers for the step's layout (srun): each node's first task.
    pub layout: Result<Vec<u32>, String>,
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
            port_taken: None,
            sysctls: BTreeMap::new(),
            files: BTreeMap::new(),
            mask: CpuSet::parse("0-15").unwrap_or_default(),
            mem_nodes: Vec::new(),
            devices: BTreeMap::new(),
            stepd_env: BTreeMap::new(),
            command: Vec::new(),
            layout: Err("no layout in this fake".into()),
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
        Ok(self.options.get(option.name()).cloned())
    }

    fn setenv(&mut self, name: &str, value: &str, overwrite: bool) -> Result<bool, SpankError> {
        if !overwrite && self.env.contains_key(name) {
            return Ok(false);
        }
        self.env.insert(name.to_owned(), value.to_owned());
        Ok(true)
    }

    fn srun_env(&mut self, name: &str, value: Option<&str>) -> Result<(), io::Error> {
        assert_eq!(self.context, Context::Local, "srun's environment outside srun");
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
        Ok(self.env.get(name).cloned())
    }

    fn task_stderr(&self, line: &str) {
        self.stderr.borrow_mut().push(line.to_owned());
    }

    fn command(&self) -> Result<Vec<String>, SpankError> {
        Ok(self.command.clone())
    }

    fn step_first_tasks(&self, _job_id: u32, _step_id: u32) -> Result<Vec<u32>, String> {
        self.layout.clone()
    }
}

impl Node for FakeSpank {
    fn probe_port(&self, _port: u16) -> io::Result<()> {
        self.port_taken.clone().map_or(Ok(()), |who| Err(io::Error::new(io::ErrorKind::AddrInUse, who)))
    }

    fn sysctl(&self, key: &'static str) -> Option<String> {
        self.sysctls.get(key).cloned()
    }

    fn read_trusted(&self, path: &str, _max_bytes: usize) -> io::Result<String> {
        self.files.get(path).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{path}: No such file or directory"))
        })
    }

    fn stepd_env(&self, name: &'static str) -> Option<String> {
        self.stepd_env.get(name).cloned()
    }

    fn device_access(&self, path: &str) -> gpu_core::devices::Access {
        self.devices.get(path).copied().unwrap_or(gpu_core::devices::Access::Unknown)
    }

    fn affinity(&self) -> io::Result<CpuSet> {
        Ok(self.mask.clone())
    }

    fn set_affinity(&mut self, cpus: &CpuSet) -> io::Result<()> {
        self.mask = cpus.clone();
        Ok(())
    }

    fn prefer_memory(&mut self, nodes: &[u32]) -> io::Result<()> {
        self.mem_nodes = nodes.to_vec();
        Ok(())
    }
}
