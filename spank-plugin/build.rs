//! Link flags of the plugin.
//!
//! `-z nodelete`: Slurm `dlclose`s plugins; Rust's thread-local destructors
//! and std's runtime state must never be unmapped under a live process.
fn main() {
    println!("cargo::rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
