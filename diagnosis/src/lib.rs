//! `spank-gpu why` and `spank-gpu autopsy`: why a job is still pending, and
//! why a job died, in words and with the next step, on every Slurm release
//! from 22.05 to 26.05.
//!
//! Everything here works on what Slurm's read-only commands print and on
//! what the caller found on disk; the command runs them and hands the text
//! in. Nothing here runs a command. The parts:
//!
//! - [`release`]: which release, and what it offers (one table of facts);
//! - [`reasons`]: every `enum job_state_reason` value by name, with its
//!   printed string and the releases it exists in (the table as data);
//! - [`explain`]: reasons, exit codes and states in words;
//! - the parsers: [`scontrol`] (job records as text, read so that user text
//!   is never a field), [`json`] (`scontrol show job --json`, `sacct --json`
//!   where the release has data_parser v0.0.42), [`parse`] (`--parsable2`;
//!   durations and sizes are `slurm_formats::units`), [`time`] (times);
//! - [`agent`]: the GPU agent's drain reasons decoded;
//! - [`why`] and [`autopsy`] (with [`evidence`]: logs, node events, log paths;
//!   [`first_failure`]: which task died first and what the others died of;
//!   [`causes`]: the cause a log shows; [`preemption`]: what a preempted job
//!   was sent): the conclusions;
//! - [`usage`]: whether a job used its GPUs, from the agent's summaries
//!   (`spank-gpu usage`, `autopsy`'s "GPU use"), and [`steps`]: the job's
//!   nodes on which no step ran, from Slurm's step records.
//!
//! A new Slurm release is new rows in [`reasons::REASONS`] (and words in
//! [`explain`] for a string never seen) and, where it changes what the
//! commands print, rows in [`release::FEATURES`].

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

pub mod agent;
pub mod autopsy;
pub mod causes;
pub mod evidence;
pub mod explain;
pub mod first_failure;
pub mod json;
pub mod limits;
pub mod parse;
pub mod preemption;
pub mod reasons;
pub mod release;
pub mod scontrol;
pub mod steps;
pub mod time;
pub mod usage;
pub mod why;

/// A row of `sacct -P`, a `scontrol show job` record (text or JSON): field → value.
pub type Row = BTreeMap<String, String>;

pub use agent::{AgentDrain, decode_agent_reason};
pub use autopsy::{
    Autopsy, EndedJob, Lookup, autopsy, ended_job, fix_glued_paths, requeue_recipe, sacct_fields,
};
pub use causes::{Cause, CauseClass};
pub use evidence::{
    Blocker, NodeEvent, OomKind, PathCheck, classify_oom, events_from_nodes, ids_from_proc_status, may_write,
    merge_events, parse_events,
};
pub use explain::{
    Explanation, Remedy, exit_in_words, explain_reason, is_active_state, is_running_state, raised_signal,
    read_reason, reason_code, state_in_words,
};
pub use first_failure::{AtFrom, Consequence, Death, FirstFailure};
pub use json::{JsonError, parse_sacct_jobs, parse_scontrol_jobs};
pub use limits::{
    AssocMgr, JobAsk, Limit, LimitFinding, LimitReason, Scope, find_limit, job_ask, limit_reason,
    parse_assoc_mgr,
};
pub use parse::{TEXT_COLUMNS, parse_parsable, parse_parsable_with};
pub use preemption::{PreemptConfig, Preemption};
pub use reasons::{REASONS, Reason, enum_names, reasons_in};
pub use release::{Feature, Release};
pub use scontrol::{
    Dependency, RecordError, parse_dependencies, parse_job_record, parse_record, unavailable_nodes,
};
pub use time::{format_time, local_time, parse_time};
pub use usage::{GpuRow, JobFacts, Source, UsageReport};
pub use why::{DependencyJob, NodeOut, Why, split_advice, time_advice, why, why_advice, why_limit};
