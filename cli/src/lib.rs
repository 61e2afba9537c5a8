//! The `spank-gpu` command's parts that tests outside this package use:
//! [`explain`], which the plugin's tests check against the plugin's own run.

#![forbid(unsafe_code)]

pub mod explain;
