//! Slurm's step ids: the special ones, and a step id as Slurm prints it.

/// Slurm's step id of a batch script.
pub const BATCH_STEP: u32 = 0xffff_fffb;

/// A step id as Slurm prints it.
pub fn step_name(step_id: u32) -> String {
    match step_id {
        BATCH_STEP => "batch".to_owned(),
        0xffff_fffc => "extern".to_owned(),
        0xffff_fffa => "interactive".to_owned(),
        n => n.to_string(),
    }
}
