//! A set of logical CPU ids in the Linux list syntax (`"0-3,5"`), as the kernel writes
//! `cpuset.cpus` and sysfs `cpulist` files (upstream `k8s.io/utils/cpuset`).

use std::collections::BTreeSet;
use std::fmt;

/// A set of logical CPU ids, ordered ascending.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<usize>);

/// A cpuset string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cpuset {input:?}: {reason}")]
pub struct ParseError {
    /// The text given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

impl CpuSet {
    /// The empty set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the list syntax: comma-separated ids and inclusive ranges `a-b` (a <= b);
    /// blanks around the text are ignored and the empty text is the empty set.
    ///
    /// # Errors
    /// [`ParseError`] naming the element that is not an id or a range.
    pub fn parse(input: &str) -> Result<Self, ParseError> {
        let err = |reason: String| ParseError { input: input.to_owned(), reason };
        let text = input.trim();
        let mut set = BTreeSet::new();
        if text.is_empty() {
            return Ok(Self(set));
        }
        for part in text.split(',') {
            let part = part.trim();
            let num = |s: &str| s.trim().parse::<usize>().map_err(|_| err(format!("{s:?} is not a CPU id")));
            if let Some((a, b)) = part.split_once('-') {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(err(format!("range {part:?} is reversed")));
                }
                set.extend(a..=b);
            } else {
                set.insert(num(part)?);
            }
        }
        Ok(Self(set))
    }

    /// How many CPUs the set holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `cpu` is in the set.
    #[must_use]
    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    /// The ids, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied()
    }

    /// The ids as a vector, ascending.
    #[must_use]
    pub fn to_vec(&self) -> Vec<usize> {
        self.iter().collect()
    }

    /// CPUs in either set.
    #[must_use]
    pub fn union(&self, other: &Self) -> Self {
        Self(self.0.union(&other.0).copied().collect())
    }

    /// CPUs in both sets.
    #[must_use]
    pub fn intersection(&self, other: &Self) -> Self {
        Self(self.0.intersection(&other.0).copied().collect())
    }

    /// CPUs in `self` but not in `other`.
    #[must_use]
    pub fn difference(&self, other: &Self) -> Self {
        Self(self.0.difference(&other.0).copied().collect())
    }

    /// Whether every CPU of `self` is in `other`.
    #[must_use]
    pub fn is_subset_of(&self, other: &Self) -> bool {
        self.0.is_subset(&other.0)
    }

    /// The CPUs that satisfy `keep`.
    #[must_use]
    pub fn filter(&self, mut keep: impl FnMut(usize) -> bool) -> Self {
        Self(self.0.iter().copied().filter(|c| keep(*c)).collect())
    }
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    /// The canonical list syntax: ascending, runs of two or more as ranges (`0-2,4`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_the_list_syntax() {
        for (text, ids, canonical) in [
            ("", vec![], ""),
            ("0", vec![0], "0"),
            ("0-3,5", vec![0, 1, 2, 3, 5], "0-3,5"),
            (" 5,0-1,1 \n", vec![0, 1, 5], "0-1,5"),
            ("0,1", vec![0, 1], "0-1"),
            ("2-2,7,8,9,11", vec![2, 7, 8, 9, 11], "2,7-9,11"),
        ] {
            let set = CpuSet::parse(text).unwrap();
            assert_eq!(set.to_vec(), ids, "{text:?}");
            assert_eq!(set.to_string(), canonical, "{text:?}");
        }
    }

    #[test]
    fn rejects_garbage_with_the_reason() {
        assert_eq!(CpuSet::parse("3-1").unwrap_err().reason, "range \"3-1\" is reversed");
        assert_eq!(CpuSet::parse("a").unwrap_err().to_string(), "invalid cpuset \"a\": \"a\" is not a CPU id");
        assert!(CpuSet::parse("1,,2").is_err());
        assert!(CpuSet::parse("-1").is_err());
    }

    #[test]
    fn set_operations() {
        let a = CpuSet::parse("0-3").unwrap();
        let b = CpuSet::parse("2-5").unwrap();
        assert_eq!(a.union(&b).to_string(), "0-5");
        assert_eq!(a.intersection(&b).to_string(), "2-3");
        assert_eq!(a.difference(&b).to_string(), "0-1");
        assert!(CpuSet::parse("1-2").unwrap().is_subset_of(&a));
        assert_eq!(a.filter(|c| c % 2 == 0).to_string(), "0,2");
    }
}
