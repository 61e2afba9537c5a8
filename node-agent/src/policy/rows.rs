//! The "in a row" counters and the poll clock, pure: one rule for all of
//! them.
//!
//! Some faults count only after they are seen in several checks in a row:
//! a clock slowdown in [`super::checks::SLOWDOWN_CHECKS`] checks, a hung
//! GPU over `nvml_hang_polls` polls; a drained node is resumed after
//! `resume_after` clean checks; the NVLink error rate is measured from the
//! last check's counters. These counts are the poll clock's: only a pass on
//! it ([`Step::Advance`]: the daemon's poll every `poll_interval`, or a
//! `check`, as run by hand or as Slurm's HealthCheckProgram) moves them on.
//! A pass off the clock ([`Step::Hold`]: asked for by the Epilog gate, or
//! run at once for an Xid) reports what it sees against them, and may end a
//! run (a check without the condition starts the count over, which only
//! ever delays a drain), but never adds to one: a burst of passes between
//! two polls (three jobs ending together) counts as no more than the polls.

/// What a pass may do to the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A pass on the poll clock: a count goes up by one.
    Advance,
    /// A pass off the clock: counts stay as the last poll left them.
    Hold,
}

/// A count after a check: 0 when the condition is not seen (a run is
/// broken by any check), one more when it is seen on the poll clock, the
/// same when it is seen off it.
pub const fn next(count: u32, seen: bool, step: Step) -> u32 {
    match (seen, step) {
        (false, _) => 0,
        (true, Step::Advance) => count.saturating_add(1),
        (true, Step::Hold) => count,
    }
}

/// The base a rate is measured from after a check: on the poll clock the
/// reading just taken; off it the poll's base stays (a reading taken a
/// moment after the poll would make a short, noisy window), unless there is
/// none yet.
pub fn base<T>(before: Option<T>, now: T, step: Step) -> T {
    match (before, step) {
        (Some(b), Step::Hold) => b,
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_poll_clock_adds_to_a_count() {
        assert_eq!(next(2, true, Step::Advance), 3);
        assert_eq!(next(2, true, Step::Hold), 2);
        assert_eq!(next(0, true, Step::Hold), 0, "a first sighting off the clock is not a check in a row");
        assert_eq!(next(u32::MAX, true, Step::Advance), u32::MAX);
        for step in [Step::Advance, Step::Hold] {
            assert_eq!(next(5, false, step), 0, "any check without the condition ends the run");
        }
    }

    #[test]
    fn any_number_of_passes_between_two_polls_count_as_none() {
        let mut n = 0;
        for poll in 0..3 {
            n = next(n, true, Step::Advance);
            for _ in 0..100 {
                n = next(n, true, Step::Hold);
            }
            assert_eq!(n, poll + 1);
        }
    }

    #[test]
    fn a_rate_base_moves_only_on_the_clock() {
        assert_eq!(base(Some(1), 9, Step::Hold), 1);
        assert_eq!(base(Some(1), 9, Step::Advance), 9);
        assert_eq!(base(None, 9, Step::Hold), 9);
    }
}
