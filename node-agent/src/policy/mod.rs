//! What a GPU's readings mean, pure: what NVML said ([`sample`]) turned into
//! faults ([`health`], and [`checks`] for PCIe, NVLink, fabric, clocks, ECC
//! and persistence modes) and drain reasons; [`rows`]: the "in a row"
//! counters advance only on the poll clock. What to do about them is
//! [`crate::decide`]. No I/O: table-tested.

pub mod checks;
pub mod health;
pub mod rows;
pub mod sample;
