//! What the agent tells others: the node_exporter textfile ([`metrics`]),
//! its log ([`logging`]), systemd ([`sdnotify`]), and the GPU table the
//! plugin reads ([`topo`]).

pub mod logging;
pub mod metrics;
pub mod sdnotify;
pub mod topo;
