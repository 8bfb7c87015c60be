//! The page → batch → cursor walk both the run ([`super::enqueue`]) and
//! the recovery of an interrupted one ([`super::doubt`]) make over a
//! list's members in id order: active members are cut into jobs of
//! `--batch-size`, skipped ones are held until a step records them, and
//! the cursor a step may confirm is the last member before which nothing
//! waits in an unfinished batch.

/// What one member read means for the walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Member {
    /// Goes into a job.
    Active,
    /// Not active (unsubscribed, bounced): recorded as skipped.
    Skipped,
    /// Already in a job or the ledger (a recovery found it): neither.
    Found,
}

/// The walk's state between members and pages.
#[derive(Debug)]
pub(super) struct Batcher {
    size: usize,
    /// Active members not yet in a full batch.
    carry: Vec<i64>,
    /// Skipped members read and not yet taken by a step, in id order.
    skips: Vec<i64>,
    /// Every member up to here is in a full batch, skipped or found.
    covered: i64,
    /// The last member read.
    pos: i64,
}

impl Batcher {
    /// A walk of batches of `size` starting after member `after`.
    pub fn new(size: usize, after: i64) -> Batcher {
        Batcher {
            size,
            carry: Vec::with_capacity(size),
            skips: Vec::new(),
            covered: after,
            pos: after,
        }
    }

    /// Take the next member (ids ascending); a batch when it fills one.
    pub fn push(&mut self, rid: i64, member: Member) -> Option<Vec<i64>> {
        self.pos = rid;
        let mut full = None;
        match member {
            Member::Active => {
                self.carry.push(rid);
                if self.carry.len() == self.size {
                    full = Some(std::mem::replace(
                        &mut self.carry,
                        Vec::with_capacity(self.size),
                    ));
                }
            }
            Member::Skipped => self.skips.push(rid),
            Member::Found => {}
        }
        if self.carry.is_empty() {
            self.covered = rid;
        }
        full
    }

    /// The cursor a step may confirm now.
    pub fn covered(&self) -> i64 {
        self.covered
    }

    /// The last member read.
    pub fn pos(&self) -> i64 {
        self.pos
    }

    /// The first member of the unfinished batch, if any.
    pub fn first_carried(&self) -> Option<i64> {
        self.carry.first().copied()
    }

    /// The skipped members up to the cursor: a step records them as it
    /// moves past them.
    pub fn take_covered_skips(&mut self) -> Vec<i64> {
        let split = self.skips.partition_point(|&rid| rid <= self.covered);
        let rest = self.skips.split_off(split);
        std::mem::replace(&mut self.skips, rest)
    }

    /// The unfinished batch as a shorter last job: the cursor moves to the
    /// last member read (so every held skip is covered).
    pub fn finish(&mut self) -> Vec<i64> {
        self.covered = self.pos;
        std::mem::take(&mut self.carry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(size: usize, members: &[(i64, Member)]) -> (Vec<Vec<i64>>, Batcher) {
        let mut b = Batcher::new(size, 0);
        let full = members
            .iter()
            .filter_map(|&(rid, m)| b.push(rid, m))
            .collect();
        (full, b)
    }

    #[test]
    fn active_members_make_full_batches_and_the_cursor_stops_before_a_partial_one() {
        use Member::*;
        let (full, mut b) = walk(
            2,
            &[
                (1, Active),
                (2, Skipped),
                (3, Active),
                (4, Active),
                (5, Skipped),
            ],
        );
        assert_eq!(full, [vec![1, 3]]);
        // 4 is carried: the cursor stays at 3, and only skip 2 is covered.
        assert_eq!(b.covered(), 3);
        assert_eq!(b.take_covered_skips(), [2]);
        assert_eq!(b.take_covered_skips(), Vec::<i64>::new());
        assert_eq!(b.pos(), 5);
        assert_eq!(b.first_carried(), Some(4));
        assert_eq!(b.finish(), [4]);
        assert_eq!(b.covered(), 5);
        assert_eq!(b.take_covered_skips(), [5]);
    }

    #[test]
    fn found_members_move_the_cursor_but_fill_no_batch() {
        use Member::*;
        let (full, b) = walk(2, &[(1, Found), (2, Found), (3, Active)]);
        assert!(full.is_empty());
        assert_eq!(b.covered(), 2);
        let (full, b) = walk(2, &[(1, Active), (2, Found), (3, Active)]);
        assert_eq!(full, [vec![1, 3]]);
        assert_eq!(b.covered(), 3);
    }
}
