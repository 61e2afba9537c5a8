//! Sets of CPU (or NUMA node) numbers, in the kernel's list format.
//!
//! `0-3,8-11` is how Linux, Slurm and hwloc print CPU lists
//! (`Cpus_allowed_list`, `cpuset.cpus`, `--cpu-bind=verbose`). A [`CpuSet`] is a
//! plain bitset: cheap to intersect and count on the launch path.

use std::fmt;

const BITS: usize = 64;
/// The largest CPU number accepted from text: generous for any real machine,
/// small enough that a hostile `0-4294967295` cannot allocate gigabytes.
pub const MAX_CPU: u32 = 1 << 20;

/// A set of CPU numbers.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    words: Vec<u64>,
}

/// Text that is not a CPU list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuSetError {
    /// The text as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for CpuSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad CPU list '{}': {}", self.input, self.reason)
    }
}

impl std::error::Error for CpuSetError {}

impl CpuSet {
    /// The empty set.
    pub fn new() -> CpuSet {
        CpuSet::default()
    }

    /// Parses a list like `0-3,8,10-11`. Whitespace around the list and its
    /// items is ignored; an empty string is the empty set.
    ///
    /// # Errors
    /// A malformed item, a range that runs backwards, or a number above [`MAX_CPU`].
    pub fn parse(text: &str) -> Result<CpuSet, CpuSetError> {
        let err = |reason: String| CpuSetError { input: crate::text::clip(text, 200), reason };
        let number = |s: &str| -> Result<u32, CpuSetError> {
            let n: u32 = s.trim().parse().map_err(|_| err(format!("'{}' is not a CPU number", s.trim())))?;
            if n > MAX_CPU {
                return Err(err(format!("CPU {n} is above the limit {MAX_CPU}")));
            }
            Ok(n)
        };
        let mut set = CpuSet::new();
        let text_trimmed = text.trim();
        if text_trimmed.is_empty() {
            return Ok(set);
        }
        for item in text_trimmed.split(',') {
            match item.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (number(lo)?, number(hi)?);
                    if lo > hi {
                        return Err(err(format!("range {lo}-{hi} runs backwards")));
                    }
                    set.insert_range(lo, hi);
                }
                None => set.insert(number(item)?),
            }
        }
        Ok(set)
    }

    /// A set from bitmask words, bit `i` of word `w` being CPU `64*w + i`
    /// (the layout of `cpu_set_t` and of NVML's affinity arrays on 64-bit Linux).
    pub fn from_words(words: &[u64]) -> CpuSet {
        let mut set = CpuSet { words: words.to_vec() };
        set.trim();
        set
    }

    /// The bitmask words, at least `min_words` of them.
    pub fn to_words(&self, min_words: usize) -> Vec<u64> {
        let mut w = self.words.clone();
        if w.len() < min_words {
            w.resize(min_words, 0);
        }
        w
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }

    /// Adds one CPU.
    pub fn insert(&mut self, cpu: u32) {
        let (w, b) = (cpu as usize / BITS, cpu as usize % BITS);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << b;
    }

    /// Adds `lo..=hi`.
    pub fn insert_range(&mut self, lo: u32, hi: u32) {
        for cpu in lo..=hi {
            self.insert(cpu);
        }
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        let (w, b) = (cpu as usize / BITS, cpu as usize % BITS);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    /// Number of CPUs in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// CPUs in both sets.
    #[must_use]
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        let words = self.words.iter().zip(&other.words).map(|(a, b)| a & b).collect();
        let mut set = CpuSet { words };
        set.trim();
        set
    }

    /// CPUs in either set.
    #[must_use]
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let n = self.words.len().max(other.words.len());
        let words = (0..n)
            .map(|i| self.words.get(i).copied().unwrap_or(0) | other.words.get(i).copied().unwrap_or(0))
            .collect();
        CpuSet { words }
    }

    /// Whether every CPU of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.intersection(other) == *self
    }

    /// Whether the sets share a CPU (without building their intersection).
    pub fn intersects(&self, other: &CpuSet) -> bool {
        self.words.iter().zip(&other.words).any(|(a, b)| a & b != 0)
    }

    /// The CPUs in increasing order, visiting only the set bits of each word.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(w, word)| {
            let mut bits = *word;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                // w * 64 + b fits in u32: words are only created from u32 CPU numbers.
                Some(u32::try_from(w * BITS + b).unwrap_or(u32::MAX))
            })
        })
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut set = CpuSet::new();
        for cpu in iter {
            set.insert(cpu);
        }
        set
    }
}

impl fmt::Display for CpuSet {
    /// The kernel's list format, ranges merged: `0-3,8-11`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut cpus = self.iter().peekable();
        while let Some(lo) = cpus.next() {
            let mut hi = lo;
            while cpus.peek() == Some(&(hi + 1)) {
                hi += 1;
                cpus.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi { write!(f, "{lo}")? } else { write!(f, "{lo}-{hi}")? }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_lists() {
        for (text, canon) in [
            ("0-3,8-11", "0-3,8-11"),
            ("0,1,2,3", "0-3"),
            (" 5 , 1-2 \n", "1-2,5"),
            ("", ""),
            ("63-65", "63-65"),
            ("0-55,112-167", "0-55,112-167"),
        ] {
            assert_eq!(CpuSet::parse(text).unwrap().to_string(), canon, "{text:?}");
        }
    }

    #[test]
    fn rejects_bad_lists() {
        for text in ["a", "1-", "-1", "3-1", "1,,2", "1-2-3", "99999999", "0-2000000"] {
            assert!(CpuSet::parse(text).is_err(), "{text:?} accepted");
        }
    }

    #[test]
    fn set_operations() {
        let a = CpuSet::parse("0-7").unwrap();
        let b = CpuSet::parse("4-11").unwrap();
        assert_eq!(a.intersection(&b).to_string(), "4-7");
        assert_eq!(a.union(&b).to_string(), "0-11");
        assert_eq!(a.len(), 8);
        assert!(CpuSet::parse("4-5").unwrap().is_subset(&a));
        assert!(!b.is_subset(&a));
        assert!(a.intersection(&CpuSet::parse("100").unwrap()).is_empty());
    }

    #[test]
    fn words_round_trip() {
        let s = CpuSet::parse("0,63,64,130").unwrap();
        let w = s.to_words(4);
        assert_eq!(w, vec![1 | 1 << 63, 1, 1 << 2, 0]);
        assert_eq!(CpuSet::from_words(&w), s);
    }

    #[test]
    fn equality_ignores_trailing_empty_words() {
        let a = CpuSet::parse("1").unwrap();
        let b = CpuSet::parse("1,200").unwrap().intersection(&CpuSet::parse("0-10").unwrap());
        assert_eq!(a, b);
    }
}
