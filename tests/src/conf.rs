//! The lab's configuration files: slurm.conf, gres.conf, cgroup.conf,
//! topology.conf and plugstack.conf, the fake GPU device files, and the
//! plugin put in place.

use crate::*;

impl Lab {
    pub(crate) fn make_devices(&self) -> Result<()> {
        for minor in 0..self.cfg.gpus_per_node {
            let path = self.dir.join(format!("cdev/nvidia{minor}"));
            run(Command::new("mknod")
                .arg("-m")
                .arg("0666")
                .arg(&path)
                .arg("c")
                .arg(NVIDIA_MAJOR.to_string())
                .arg(minor.to_string()))?;
        }
        Ok(())
    }

    /// Copies `plugin` into the lab and renames it into place, so no Slurm
    /// process ever maps a half-written file.
    ///
    /// # Errors
    /// The plugin file cannot be read or written.
    pub fn install_plugin(&self, plugin: &Path) -> Result<()> {
        if !plugin.is_file() {
            return err(format!(
                "plugin {} not found; build it first (cargo build -p spank-gpu)",
                plugin.display()
            ));
        }
        let tmp = self.dir.join("lib/.spank_gpu.so.tmp");
        fs::copy(plugin, &tmp)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        fs::rename(&tmp, self.plugin_path())?;
        Ok(())
    }

    /// Rewrites `plugstack.conf` (atomically) with these words after the plugin
    /// path. srun, sbatch and every new step read it afresh; slurmd only at start.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn set_plugstack_args(&self, args: &[&str]) -> Result<()> {
        // Every node sees its own GPU table at <lab>/topology.
        let topology = if args.iter().any(|a| a.starts_with("topology_dir=")) {
            String::new()
        } else {
            format!(" topology_dir={}", self.topology_dir().display())
        };
        // The lab's GPUs are device files in <lab>/cdev, not /dev: the debug build's
        // `debug_dev_dir` points the plugin's device-cgroup probe there (an installed
        // release build has no such key, and the lab gives it none).
        let installed = std::env::var_os("SLURM_LAB_INSTALLED").is_some();
        let dev_dir = if installed || args.iter().any(|a| a.starts_with("debug_dev_dir=")) {
            String::new()
        } else {
            format!(" debug_dev_dir={}", self.dir.join("cdev").display())
        };
        let mut line = if self.cfg.plugin.is_some() {
            format!("required {} {}{topology}{dev_dir}\n", self.plugin_path().display(), args.join(" "))
        } else {
            String::new()
        };
        // pyxis before or after it (SPANK calls each hook of every plugin in file order).
        if let Some(pyxis) = self.pyxis_line() {
            match self.cfg.containers.as_ref().map(|c| c.order) {
                Some(crate::containers::Order::PyxisFirst) => line.insert_str(0, &pyxis),
                _ => line.push_str(&pyxis),
            }
        }
        self.write_atomic("etc/plugstack.conf", &line)
    }

    pub(crate) fn write_atomic(&self, rel: &str, text: &str) -> Result<()> {
        let path = self.dir.join(rel);
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, text)?;
        fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// Node `index`'s address on the lab's bridge, which the host reaches.
    pub fn node_addr(index: usize) -> String {
        format!("10.77.0.1{}", index + 1)
    }

    /// Node `index`'s address on the fabric ([`FABRIC_NET`]).
    pub fn fabric_addr(index: usize) -> String {
        format!("10.78.0.1{}", index + 1)
    }

    /// The name of node `node`'s fabric interface: a different one on each
    /// node, as on sites whose NICs sit in different slots.
    pub fn fabric_interface(node: &str) -> String {
        match node {
            "node1" => "ens1f0np0".to_owned(),
            "node2" => "enp65s0f1".to_owned(),
            other => format!("enp{}s0", 65 + other.trim_start_matches("node").parse::<u32>().unwrap_or(0)),
        }
    }

    pub(crate) fn write_configs(&self) -> Result<()> {
        let d = self.dir.display();
        let host = hostname()?;
        let mut conf = format!(
            "ClusterName=lab
SlurmctldHost={host}({CTLD_ADDR})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={d}/state/ctld
SlurmdSpoolDir={d}/state/slurmd-%n
TmpFS={d}/nodes/%n/tmp
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=verbose
MailProg=/bin/true
SelectType=select/cons_tres
GresTypes=gpu
ReturnToService=2
MpiDefault=none
MpiParams=ports=30000-30999
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=1
SlurmdParameters=config_overrides
PlugStackConfig={d}/etc/plugstack.conf
RebootProgram={d}/bin/reboot
ResumeTimeout=30
"
        );
        // A reboot that only records that it was asked for.
        let reboot = self.dir.join("bin/reboot");
        fs::write(&reboot, format!("#!/bin/sh\necho \"$(hostname) $*\" >> {d}/log/reboots\n"))?;
        fs::set_permissions(&reboot, fs::Permissions::from_mode(0o755))?;
        if self.cfg.accounting {
            let _ = write!(
                conf,
                "SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={CTLD_ADDR}
AccountingStoragePort={SLURMDBD_PORT}
AccountingStorageTRES=gres/gpu
AccountingStorageEnforce=associations,limits
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
PrivateData=jobs
"
            );
        } else {
            conf.push_str(
                "SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
",
            );
        }
        for line in self.cfg.task_setup.slurm_conf_lines() {
            conf.push_str(line);
            conf.push('\n');
        }
        if let Some(cgroup) = self.cfg.task_setup.cgroup_conf() {
            fs::write(self.dir.join("etc/cgroup.conf"), cgroup)?;
        }
        if let Some(topology) = &self.cfg.topology_conf {
            fs::write(self.dir.join("etc/topology.conf"), topology)?;
        }
        for line in &self.cfg.extra_conf {
            conf.push_str(line);
            conf.push('\n');
        }
        for (i, node) in self.nodes.iter().enumerate() {
            let _ = writeln!(
                conf,
                "NodeName={node} NodeHostname={node} NodeAddr={} {} RealMemory=4000 Gres=gpu:h100:{} State=UNKNOWN",
                Self::node_addr(i),
                self.node_cpus.1,
                self.cfg.gpus_per_node
            );
        }
        conf.push_str("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n");
        fs::write(self.slurm_conf(), conf)?;

        let last = self.cfg.gpus_per_node.saturating_sub(1);
        let mut gres = String::new();
        for node in &self.nodes {
            let custom = self
                .cfg
                .node_gres
                .iter()
                .find(|(n, _)| n == node)
                .map(|(_, g)| g.replace("{dir}", &d.to_string()));
            let files = custom.unwrap_or_else(|| format!("File={d}/cdev/nvidia[0-{last}]"));
            for line in files.lines() {
                let _ = writeln!(gres, "NodeName={node} Name=gpu Type=h100 {line}");
            }
        }
        fs::write(self.dir.join("etc/gres.conf"), gres)?;

        let mut hosts = format!("127.0.0.1 localhost\n{CTLD_ADDR} {host}\n");
        for (i, node) in self.nodes.iter().enumerate() {
            let _ = writeln!(hosts, "{} {node}", Self::node_addr(i));
        }
        fs::write(self.dir.join("etc/hosts"), hosts)?;

        self.write_enroot_conf()?;
        let args: Vec<&str> = self.cfg.plugstack_args.iter().map(String::as_str).collect();
        self.set_plugstack_args(&args)
    }
}
