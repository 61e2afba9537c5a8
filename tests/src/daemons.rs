//! The lab's daemons: munge, MariaDB and slurmdbd, slurmctld and one slurmd
//! per node in its own namespaces, and programs spawned on a node.

use crate::*;

impl Lab {
    /// Mounts what the root needs (see [`Root::mount`]) and writes
    /// `bin/in-root`, which runs a command in the root, in the caller's
    /// directory, with the caller's environment.
    pub(crate) fn mount_root(&self) -> Result<()> {
        let Some(root) = &self.root else { return Ok(()) };
        let build = profile_dir();
        let mut extra = extra_mounts();
        extra.extend(self.container_dirs());
        let mut dirs = vec![(self.dir.as_path(), false), (build.as_path(), true)];
        dirs.extend(extra.iter().map(|d| (d.as_path(), true)));
        root.mount(&dirs, &|l| record(l))?;
        // The controller and the clients in the root resolve the host and the
        // nodes as on the host (srun and slurmctld look up the host's name).
        let hosts = root.inside(Path::new("/etc/hosts"));
        record(&format!("mount {}", hosts.display()))?;
        run(Command::new("mount").arg("--bind").arg(self.dir.join("etc/hosts")).arg(&hosts))?;
        let wrapper = self.dir.join("bin/in-root");
        fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\n# Runs a command in the Slurm {} root, in the caller's directory.\n\
                 # Inside a node (its mount namespace, whose root the root is) the\n\
                 # root's path does not exist: the command runs as it is.\n\
                 dir=$(pwd)\n[ -d {r}/usr ] || exec \"$@\"\n\
                 exec chroot {r} /bin/sh -c 'cd \"$1\" 2>/dev/null || cd /; shift; exec \"$@\"' in-root \"$dir\" \"$@\"\n",
                root.release,
                r = root.path.display()
            ),
        )?;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))?;
        Ok(())
    }

    /// Records the `slurm_NODE` cgroup of every node in every v1 hierarchy for
    /// teardown, except any that exists already (not the lab's to remove).
    pub(crate) fn record_cgroups(&mut self) -> Result<()> {
        if self.cfg.task_setup != TaskSetup::AffinityCgroup {
            return Ok(());
        }
        let controllers = cgroup_v1_controllers();
        if !controllers.iter().any(|c| c.ends_with("cpuset"))
            || !controllers.iter().any(|c| c.ends_with("devices"))
        {
            return err(format!(
                "task/cgroup needs the cgroup v1 cpuset and devices controllers mounted under {CGROUP_ROOT}; \
                 found {controllers:?}"
            ));
        }
        for controller in controllers {
            for node in &self.nodes {
                let path = controller.join(format!("slurm_{node}"));
                if path.exists() {
                    continue;
                }
                record(&format!("cgroup {}", path.display()))?;
                self.cgroups.push(path);
            }
        }
        Ok(())
    }

    /// The lab's MariaDB socket.
    pub(crate) fn mariadb_socket(&self) -> PathBuf {
        self.dir.join("mysql/sock")
    }

    /// MariaDB (own datadir, owned by the mysql user, which also owns the pid
    /// file's directory) and slurmdbd, then the cluster, an account and root
    /// registered with sacctmgr. slurmctld starts after this.
    pub(crate) fn start_accounting(&mut self) -> Result<()> {
        let db = self.dir.join("mysql");
        fs::create_dir_all(&db)?;
        run(Command::new("chown").args(["mysql:mysql"]).arg(&db))?;
        let datadir = format!("--datadir={}", db.join("data").display());
        run(Command::new("mariadb-install-db")
            .args([
                "--no-defaults",
                "--user=mysql",
                "--skip-test-db",
                "--auth-root-authentication-method=socket",
            ])
            .arg(&datadir))?;
        let log = fs::File::create(self.dir.join("log/mariadb.stdout"))?;
        let mut cmd = Command::new("mariadbd");
        cmd.args(["--no-defaults", "--user=mysql", "--bind-address=127.0.0.1", "--skip-name-resolve"])
            .arg(&datadir)
            .arg(format!("--socket={}", self.mariadb_socket().display()))
            .arg(format!("--pid-file={}", db.join("mariadbd.pid").display()))
            .arg(format!("--port={MARIADB_PORT}"))
            .args(["--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M", "--skip-log-bin"]);
        self.spawn("mariadbd", cmd, log)?;
        let socket = format!("--socket={}", self.mariadb_socket().display());
        let answers = || {
            Command::new("mariadb-admin")
                .args(["--no-defaults", &socket, "-u", "root", "ping"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !wait_until(Duration::from_secs(30), answers) {
            return err(format!(
                "MariaDB did not answer on {}:\n{}",
                self.mariadb_socket().display(),
                tail(&self.dir.join("log/mariadb.stdout"), 15)
            ));
        }
        run(Command::new("mariadb").args(["--no-defaults", &socket, "-u", "root", "-e"]).arg(
            // slurmdbd 24.11+ on MariaDB 11.8 dies at its first start unless the database exists.
            "CREATE DATABASE IF NOT EXISTS slurm_acct_db; \
             CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'lab'; \
             GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';",
        ))?;

        let d = self.dir.display();
        let conf = self.dir.join("etc/slurmdbd.conf");
        fs::write(
            &conf,
            format!(
                "AuthType=auth/munge\nDbdHost=localhost\nDbdPort={SLURMDBD_PORT}\nSlurmUser=root\n\
                 LogFile={d}/log/slurmdbd.log\nPidFile={d}/run/slurmdbd.pid\nDebugLevel=info\n\
                 StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={MARIADB_PORT}\n\
                 StorageUser=slurm\nStoragePass=lab\nStorageLoc=slurm_acct_db\nPrivateData=jobs\n"
            ),
        )?;
        fs::set_permissions(&conf, fs::Permissions::from_mode(0o600))?;
        let log = fs::File::create(self.dir.join("log/slurmdbd.stdout"))?;
        let mut cmd = self.daemon_command("slurmdbd");
        cmd.arg("-D");
        self.spawn("slurmdbd", cmd, log)?;
        let mut last = String::new();
        let up = wait_until(Duration::from_secs(60), || {
            match run(self.command("sacctmgr").args(["-n", "-P", "show", "cluster"])) {
                Ok(_) => true,
                Err(e) => {
                    last = e.0;
                    false
                }
            }
        });
        if !up {
            return err(format!(
                "slurmdbd did not answer: {last}\n--- slurmdbd log ---\n{}",
                tail(&self.dir.join("log/slurmdbd.log"), 15)
            ));
        }
        for args in [
            vec!["add", "cluster", "lab"],
            vec!["add", "account", "lab", "Description=lab", "Organization=lab"],
            vec!["add", "user", "root", "Account=lab"],
        ] {
            run(self.command("sacctmgr").arg("-i").args(&args))?;
        }
        Ok(())
    }

    pub(crate) fn munge_answers() -> bool {
        let Ok(mut munge) =
            Command::new("munge").arg("-n").stdout(Stdio::piped()).stderr(Stdio::null()).spawn()
        else {
            return false;
        };
        let Some(cred) = munge.stdout.take() else { return false };
        let ok = Command::new("unmunge")
            .stdin(cred)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        munge.wait().is_ok_and(|s| s.success()) && ok
    }

    pub(crate) fn ensure_munge(&mut self) -> Result<()> {
        if Self::munge_answers() {
            return Ok(());
        }
        if !Path::new("/etc/munge/munge.key").exists() {
            run(Command::new("mungekey").args(["--create", "--keyfile=/etc/munge/munge.key"]))?;
            run(Command::new("chown").args(["munge:munge", "/etc/munge/munge.key"]))?;
        }
        run(Command::new("install").args(["-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"]))?;
        let log = fs::File::create(self.dir.join("log/munged.log"))?;
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=munge", "--regid=munge", "--init-groups", "munged", "--foreground"]);
        self.spawn("munged", cmd, log)?;
        if !wait_until(Duration::from_secs(10), Self::munge_answers) {
            return err(format!("munged did not answer; see {}", self.dir.join("log/munged.log").display()));
        }
        Ok(())
    }

    pub(crate) fn make_network(&self) -> Result<()> {
        record(&format!("link {BRIDGE}"))?;
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{CTLD_ADDR}/24"), "dev", BRIDGE])?;
        ip(&["link", "set", BRIDGE, "up"])?;
        for (i, node) in self.nodes.iter().enumerate() {
            let ns = format!("{PREFIX}-{node}");
            let veth = format!("{PREFIX}-v{}", i + 1);
            record(&format!("netns {ns}"))?;
            record(&format!("link {veth}"))?;
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["link", "set", &veth, "master", BRIDGE, "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", Self::node_addr(i)), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        self.make_fabric()
    }

    /// The nodes' second network (issue 30), made after the management
    /// `eth0`, so that NCCL's own rule (the first interface that is not
    /// `docker*`, `lo` or `virbr*`) picks `eth0`, as on a real node whose
    /// management NIC came first: each node's fabric interface has another
    /// name ([`Lab::fabric_interface`]); node1 also has a `docker0` (up, not
    /// on the fabric), node2 an `ens9` that is down with an address on the
    /// fabric (never to be chosen).
    fn make_fabric(&self) -> Result<()> {
        record(&format!("link {FABRIC_BRIDGE}"))?;
        ip(&["link", "add", FABRIC_BRIDGE, "type", "bridge"])?;
        ip(&["link", "set", FABRIC_BRIDGE, "up"])?;
        for (i, node) in self.nodes.iter().enumerate() {
            let ns = format!("{PREFIX}-{node}");
            let veth = format!("{PREFIX}-f{}", i + 1);
            let name = Self::fabric_interface(node);
            record(&format!("link {veth}"))?;
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", &name, "netns", &ns])?;
            ip(&["link", "set", &veth, "master", FABRIC_BRIDGE, "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", Self::fabric_addr(i)), "dev", &name])?;
            ip(&["-n", &ns, "link", "set", &name, "up"])?;
            // veth pairs inside the node (this kernel may lack the dummy type).
            match node.as_str() {
                "node1" => {
                    ip(&["-n", &ns, "link", "add", "docker0", "type", "veth", "peer", "name", "vethd0"])?;
                    ip(&["-n", &ns, "addr", "add", "172.17.0.1/16", "dev", "docker0"])?;
                    ip(&["-n", &ns, "link", "set", "vethd0", "up"])?;
                    ip(&["-n", &ns, "link", "set", "docker0", "up"])?;
                }
                "node2" => {
                    ip(&["-n", &ns, "link", "add", "ens9", "type", "veth", "peer", "name", "veth9"])?;
                    ip(&["-n", &ns, "addr", "add", "10.78.0.99/24", "dev", "ens9"])?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub(crate) fn spawn(&mut self, name: &str, mut cmd: Command, log: fs::File) -> Result<()> {
        let child = cmd
            .env("SLURM_CONF", self.slurm_conf())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| LabError(format!("cannot start {name}: {e}")))?;
        let pid = child.id();
        record(&format!("pid {pid} {} {name}", start_time(pid).unwrap_or(0)))?;
        self.daemons.push(Daemon { name: name.to_owned(), child });
        Ok(())
    }

    pub(crate) fn start_daemons(&mut self) -> Result<()> {
        let out = fs::File::create(self.dir.join("log/slurmctld.stdout"))?;
        let mut ctld = self.daemon_command("slurmctld");
        ctld.args(["-D", "-c", "-i"]);
        self.spawn("slurmctld", ctld, out)?;
        for node in self.nodes.clone() {
            let out = fs::File::create(self.dir.join(format!("log/slurmd-{node}.stdout")))?;
            // Each node sees its own <lab>/topology (the GPU table the plugin
            // reads), its own hosts file and its own hostname; with valgrind,
            // its own slurmstepd too.
            let stepd = if self.cfg.valgrind_stepd { self.valgrind_stepd()? } else { String::new() };
            let hosts = self.dir.join("etc/hosts");
            let own = self.node_topology_dir(&node);
            let shared = self.topology_dir();
            let mut script = format!("mount --bind {} /etc/hosts && ", hosts.display());
            script.push_str(&self.container_mounts(&node));
            let _ = write!(script, "mount --bind {} {} && ", own.display(), shared.display());
            // The node's own /run/spank-gpu (the plugin's job records, the agent's summaries).
            let run_target = PathBuf::from(task_plan::jobmap::RUN_DIR);
            let run_target = self.root.as_ref().map_or_else(|| run_target.clone(), |r| r.inside(&run_target));
            fs::create_dir_all(&run_target)?;
            let _ = write!(
                script,
                "mount --bind {} {} && ",
                self.node_run_dir(&node).display(),
                run_target.display()
            );
            let exec = match &self.root {
                None => "exec slurmd -D".to_owned(),
                Some(root) => {
                    // The root sees the node's own files too.
                    let _ = write!(
                        script,
                        "mount --bind {} {} && mount --bind {} {} && ",
                        hosts.display(),
                        root.inside(Path::new("/etc/hosts")).display(),
                        own.display(),
                        root.inside(&shared).display()
                    );
                    // The node enters its root by pivot_root, as a real node's
                    // root is its own: Apptainer refuses to start in a chroot
                    // ("Running inside a weak chrooted environment, prefer
                    // pivot_root instead of chroot"). The root is bound on itself
                    // with its mounts (pivot_root wants a mount point), `/tmp` too
                    // (Apptainer builds want it to be one), and the host's root,
                    // stacked on it by `pivot_root . .`, is detached.
                    let r = root.path.display();
                    format!(
                        "mount --rbind {r} {r} && mount --rbind {r}/tmp {r}/tmp && cd {r} && pivot_root . . && \
                         umount -l . && cd / && exec slurmd -D"
                    )
                }
            };
            let _ = write!(script, "{stepd}hostname {node} && {exec}");
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net=/run/netns/{PREFIX}-{node}")).args([
                "unshare",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
            ]);
            self.spawn(&format!("slurmd-{node}"), cmd, out)?;
        }
        Ok(())
    }

    /// A wrapper that runs the real slurmstepd under valgrind, and the mount
    /// command (for a node's private mount namespace) that puts it where
    /// slurmd executes slurmstepd from.
    pub(crate) fn valgrind_stepd(&self) -> Result<String> {
        let real = fs::canonicalize("/usr/sbin/slurmstepd")?;
        let copy = self.dir.join("bin/slurmstepd.real");
        if !copy.exists() {
            fs::copy(&real, &copy)?;
        }
        let wrapper = self.dir.join("bin/slurmstepd-valgrind");
        fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec valgrind --quiet --num-callers=30 --log-file={}/log/valgrind-%p.log {} \"$@\"\n",
                self.dir.display(),
                copy.display()
            ),
        )?;
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))?;
        Ok(format!("mount --bind {} {} && ", wrapper.display(), real.display()))
    }

    /// Waits until every node is exactly `idle`.
    ///
    /// # Errors
    /// The deadline passed; the message has each node's state and the tail of the logs.
    pub fn wait_idle(&mut self, timeout: Duration) -> Result<()> {
        let mut last = String::new();
        let ok = wait_until(timeout, || {
            if let Some(dead) = self.dead_daemon() {
                last = format!("{dead} exited");
                return true;
            }
            last = self.node_states().map(|s| format!("{s:?}")).unwrap_or_else(|e| e.0);
            self.nodes.iter().all(|n| self.node_state(n).is_ok_and(|s| s == "idle"))
        });
        if ok && !last.contains("exited") {
            return Ok(());
        }
        let node = &self.nodes[0];
        err(format!(
            "nodes not idle after {timeout:?}: {last}\n--- slurmctld log ---\n{}\n--- slurmd log ---\n{}\n\
             --- slurmd stdout ---\n{}",
            tail(&self.slurmctld_log(), 15),
            tail(&self.slurmd_log(node), 15),
            tail(&self.dir.join(format!("log/slurmd-{node}.stdout")), 10)
        ))
    }

    /// The first spawned daemon that has exited, if any.
    pub(crate) fn dead_daemon(&mut self) -> Option<String> {
        self.daemons
            .iter_mut()
            .filter(|d| d.name.starts_with("slurm") || d.name == "munged")
            .find_map(|d| (!matches!(d.child.try_wait(), Ok(None))).then(|| d.name.clone()))
    }

    /// Whether every daemon the lab started is still running.
    pub fn daemons_alive(&mut self) -> bool {
        self.dead_daemon().is_none()
    }

    /// The PID of a node's slurmd.
    pub fn slurmd_pid(&self, node: &str) -> Option<u32> {
        self.daemons.iter().find(|d| d.name == format!("slurmd-{node}")).map(|d| d.child.id())
    }

    /// Starts a long-running program inside a node (its network, hostname and
    /// hosts file), logging to `log/NAME.log`. It is stopped by [`Lab::stop`]
    /// or [`Lab::stop_daemon`].
    ///
    /// # Errors
    /// The node is unknown or the program cannot start.
    pub fn spawn_on(
        &mut self,
        node: &str,
        name: &str,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<()> {
        let mut cmd = self.command_on(node, program)?;
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let log = fs::File::create(self.dir.join(format!("log/{name}.log")))?;
        self.spawn(name, cmd, log)
    }

    /// Starts a long-running program on the host, beside slurmctld (outside
    /// the nodes), logging to `log/NAME.log`: recorded and stopped as
    /// [`Lab::spawn_on`]'s programs are.
    ///
    /// # Errors
    /// The program cannot start.
    pub fn spawn_host(&mut self, name: &str, program: &str, args: &[&str]) -> Result<()> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        let log = fs::File::create(self.dir.join(format!("log/{name}.log")))?;
        self.spawn(name, cmd, log)
    }

    /// Stops one program started with [`Lab::spawn_on`] (SIGTERM, then SIGKILL).
    pub fn stop_daemon(&mut self, name: &str) {
        if let Some(pos) = self.daemons.iter().position(|d| d.name == name) {
            let mut d = self.daemons.remove(pos);
            kill(d.child.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(d.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                sleep(Duration::from_millis(20));
            }
            let _ = d.child.kill();
            let _ = d.child.wait();
        }
    }

    /// The PID of a program started with [`Lab::spawn_on`].
    pub fn daemon_pid(&self, name: &str) -> Option<u32> {
        self.daemons.iter().find(|d| d.name == name).map(|d| d.child.id())
    }
}
