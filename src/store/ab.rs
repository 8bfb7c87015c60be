//! A/B tests on campaigns (table `campaign_ab`, one row per campaign that
//! has one, and `campaign_variants`, variants B, C, …: each one's subject
//! and/or its own content version).
//!
//! Who is in the sample and which variant a sample member gets is a keyed
//! hash of (the test's seed, the recipient id) ([`AbTest::assign`]): every
//! worker computes the same answer for the same recipient, on every
//! redelivery, without a write. The ledger's `deliveries.variant` records
//! what each recipient was given. The winner is written once, by the first
//! worker that meets the campaign running after the wait, with
//! `UPDATE .. WHERE winner IS NULL` ([`decide`]), from the ledger and the
//! engagement table.

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use sha2::{Digest, Sha256};

use super::schema::deliveries as d;
use super::{on, Conn, Result};

diesel::table! {
    /// A campaign's A/B test (see `store::ab`).
    campaign_ab (campaign_id) {
        campaign_id -> BigInt,
        sample_permille -> BigInt,
        wait_ms -> BigInt,
        metric -> Text,
        seed -> BigInt,
        started_at -> Nullable<BigInt>,
        winner -> Nullable<BigInt>,
        decided_at -> Nullable<BigInt>,
    }
}

diesel::table! {
    /// Variants B, C, … (n from 1).
    campaign_variants (campaign_id, n) {
        campaign_id -> BigInt,
        n -> BigInt,
        /// '': variant A's.
        subject -> Text,
        /// Its own content version; NULL: variant A's content.
        content_version -> Nullable<BigInt>,
    }
}

use campaign_ab as ab;
use campaign_variants as cv;

text_enum! {
    /// What decides an A/B test: unique opens or unique clicks per sent
    /// message.
    pub enum Metric ("A/B metric") {
        Opens = "opens",
        Clicks = "clicks",
    }
}

/// A campaign's A/B test as stored.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = campaign_ab)]
pub struct AbTest {
    pub campaign_id: i64,
    /// The sample, in thousandths of the list (10 to 500).
    pub sample_permille: i64,
    pub wait_ms: i64,
    pub metric: Metric,
    pub seed: i64,
    /// When the wait began: the first worker that met the campaign
    /// running (ms); `None` before.
    pub started_at: Option<i64>,
    /// The winning variant (0 = A); `None` until decided.
    pub winner: Option<i64>,
    pub decided_at: Option<i64>,
}

/// What a recipient gets while the test runs or after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assigned {
    /// Variant n (0 = A): a sample member's own, or the winner.
    Variant(i64),
    /// Not in the sample, and no winner yet: held back.
    Held,
}

/// What `campaign create` stores for a test.
#[derive(Debug, Clone)]
pub struct NewAb {
    pub sample_permille: i64,
    pub wait_ms: i64,
    pub metric: Metric,
    /// Variants B, C, … in order.
    pub variants: Vec<NewVariant>,
}

/// One variant besides A, as `campaign create` stores it: what it has of
/// its own (at least one of the two); the rest is variant A's.
#[derive(Debug, Clone, Default)]
pub struct NewVariant {
    pub subject: Option<String>,
    pub content: Option<VariantContent>,
}

/// A variant's own content, converted and checked as the campaign's.
#[derive(Debug, Clone)]
pub struct VariantContent {
    pub kind: super::content::ContentKind,
    /// The subject template stored with it (the variant's, or A's).
    pub subject: String,
    pub html: String,
    pub text: String,
    pub tracking: super::content::VersionTracking,
}

/// A variant besides A, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// 1 for B, 2 for C, …
    pub n: i64,
    /// Its own subject template; `None`: variant A's.
    pub subject: Option<String>,
    /// Its own content version; `None`: variant A's content.
    pub content_version: Option<i64>,
}

impl AbTest {
    /// When the winner may be picked (ms); `None` before the wait began.
    pub fn decide_at(&self) -> Option<i64> {
        self.started_at.map(|s| s.saturating_add(self.wait_ms))
    }

    /// Recipient `rid`'s place: in the sample, its variant among
    /// `variants` (A included); else the winner, or held back.
    pub fn assign(&self, rid: i64, variants: i64) -> Assigned {
        let (draw, pick) = draw(self.seed, rid);
        if draw % 1000 < self.sample_permille as u64 {
            return Assigned::Variant((pick % variants.max(1) as u64) as i64);
        }
        match self.winner {
            Some(w) => Assigned::Variant(w),
            None => Assigned::Held,
        }
    }
}

/// Two independent numbers from a keyed hash of (seed, recipient): the
/// sample draw and the variant pick.
fn draw(seed: i64, rid: i64) -> (u64, u64) {
    let mut h = Sha256::new();
    h.update(b"mailsplit-ab\0");
    h.update(seed.to_be_bytes());
    h.update(rid.to_be_bytes());
    let out = h.finalize();
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&out[i..i + 8]);
        u64::from_be_bytes(b)
    };
    (word(0), word(8))
}

/// A variant's name: A, B, C, …
pub fn variant_name(n: i64) -> String {
    char::from(b'A' + n.clamp(0, 25) as u8).to_string()
}

/// Store a campaign's test with a fresh random seed.
pub fn create(conn: &mut Conn, campaign_id: i64, new: &NewAb) -> Result<()> {
    let seed = rand::random_range(1..i64::MAX);
    on!(conn, |c| diesel::insert_into(ab::table)
        .values((
            ab::campaign_id.eq(campaign_id),
            ab::sample_permille.eq(new.sample_permille),
            ab::wait_ms.eq(new.wait_ms),
            ab::metric.eq(new.metric),
            ab::seed.eq(seed),
        ))
        .execute(c))?;
    for (i, variant) in new.variants.iter().enumerate() {
        let n = i as i64 + 1;
        let version = match &variant.content {
            Some(own) => {
                let parts = super::content::Parts {
                    kind: own.kind,
                    subject: &own.subject,
                    html: &own.html,
                    text: &own.text,
                    tracking: &own.tracking,
                };
                Some(super::content::add_variant(conn, campaign_id, n, &parts)?)
            }
            None => None,
        };
        on!(conn, |c| diesel::insert_into(cv::table)
            .values((
                cv::campaign_id.eq(campaign_id),
                cv::n.eq(n),
                cv::subject.eq(variant.subject.as_deref().unwrap_or("")),
                cv::content_version.eq(version),
            ))
            .execute(c))?;
    }
    Ok(())
}

/// The campaign's test; `None` if it has none.
pub fn get(conn: &mut Conn, campaign_id: i64) -> Result<Option<AbTest>> {
    Ok(on!(conn, |c| ab::table
        .find(campaign_id)
        .select(AbTest::as_select())
        .first(c)
        .optional())?)
}

/// Variants B, C, … in order.
pub fn variants(conn: &mut Conn, campaign_id: i64) -> Result<Vec<Variant>> {
    let rows: Vec<(i64, String, Option<i64>)> = on!(conn, |c| cv::table
        .filter(cv::campaign_id.eq(campaign_id))
        .order(cv::n)
        .select((cv::n, cv::subject, cv::content_version))
        .load(c))?;
    Ok(rows
        .into_iter()
        .map(|(n, subject, content_version)| Variant {
            n,
            subject: (!subject.is_empty()).then_some(subject),
            content_version,
        })
        .collect())
}

/// The variant the campaign's message to `recipient` was, per the ledger;
/// `None` without a test or before it was sent.
pub fn variant_of(conn: &mut Conn, campaign_id: i64, recipient: i64) -> Result<Option<i64>> {
    let found: Option<Option<i64>> = on!(conn, |c| d::table
        .find((campaign_id, recipient))
        .select(d::variant)
        .first(c)
        .optional())?;
    Ok(found.flatten())
}

/// The test, its wait begun: the first caller sets `started_at` to `now`,
/// later ones keep it.
pub fn start(conn: &mut Conn, campaign_id: i64, now: i64) -> Result<Option<AbTest>> {
    on!(conn, |c| diesel::update(
        ab::table
            .filter(ab::campaign_id.eq(campaign_id))
            .filter(ab::started_at.is_null())
    )
    .set(ab::started_at.eq(now))
    .execute(c))?;
    get(conn, campaign_id)
}

/// Record the variant each of a claim's recipients is given: `groups`
/// holds (variant, recipient ids); only rows this claim (`token`) holds
/// change.
pub fn set_variants(
    conn: &mut Conn,
    campaign_id: i64,
    token: i64,
    groups: &[(i64, Vec<i64>)],
) -> Result<()> {
    for (variant, ids) in groups.iter().filter(|(_, ids)| !ids.is_empty()) {
        on!(conn, |c| diesel::update(
            d::table
                .filter(d::campaign_id.eq(campaign_id))
                .filter(d::claim_token.eq(token))
                .filter(d::recipient_id.eq_any(ids))
        )
        .set(d::variant.eq(*variant))
        .execute(c))?;
    }
    Ok(())
}

/// Each recipient of the campaign's ledger with its state and variant,
/// by recipient id (what a test or an audit compares with the mail).
pub fn ledger(
    conn: &mut Conn,
    campaign_id: i64,
) -> Result<Vec<(i64, super::DeliveryState, Option<i64>)>> {
    Ok(on!(conn, |c| d::table
        .filter(d::campaign_id.eq(campaign_id))
        .order(d::recipient_id)
        .select((d::recipient_id, d::state, d::variant))
        .load(c))?)
}

/// One variant's sent messages and unique readers, from the ledger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, QueryableByName)]
pub struct Tally {
    #[diesel(sql_type = BigInt)]
    pub variant: i64,
    #[diesel(sql_type = BigInt)]
    pub sent: i64,
    #[diesel(sql_type = BigInt)]
    pub opened: i64,
    #[diesel(sql_type = BigInt)]
    pub clicked: i64,
}

impl Tally {
    /// The unique readers `metric` counts.
    pub fn hits(&self, metric: Metric) -> i64 {
        match metric {
            Metric::Opens => self.opened,
            Metric::Clicks => self.clicked,
        }
    }
}

/// Sent, opened and clicked (unique recipients) of each of `variants`
/// variants, A first: a count over the ledger joined with `engagement`.
pub fn tallies(conn: &mut Conn, campaign_id: i64, variants: i64) -> Result<Vec<Tally>> {
    // Only integers go into the text: the id is an i64.
    let query = format!(
        "SELECT CAST(d.variant AS BIGINT) AS variant, CAST(COUNT(*) AS BIGINT) AS sent, \
         CAST(SUM(CASE WHEN e.first_open_at IS NOT NULL THEN 1 ELSE 0 END) AS BIGINT) AS opened, \
         CAST(SUM(CASE WHEN e.first_click_at IS NOT NULL THEN 1 ELSE 0 END) AS BIGINT) AS clicked \
         FROM deliveries d LEFT JOIN engagement e \
         ON e.campaign_id = d.campaign_id AND e.recipient_id = d.recipient_id \
         WHERE d.campaign_id = {campaign_id} AND d.state = 'sent' AND d.variant IS NOT NULL \
         GROUP BY d.variant"
    );
    let rows: Vec<Tally> = on!(conn, |c| diesel::sql_query(&query).load(c))?;
    Ok((0..variants.max(1))
        .map(|n| {
            rows.iter()
                .find(|t| t.variant == n)
                .copied()
                .unwrap_or(Tally {
                    variant: n,
                    ..Tally::default()
                })
        })
        .collect())
}

/// The variant with the highest `metric` per sent message; A (the first)
/// on a tie. Rates are compared exactly (cross-multiplied).
pub fn best(tallies: &[Tally], metric: Metric) -> i64 {
    let mut best: Option<&Tally> = None;
    for t in tallies {
        let better = best.is_none_or(|b| {
            // t.hits / t.sent > b.hits / b.sent, a rate of nothing sent is 0.
            let (th, ts) = (t.hits(metric) as i128, t.sent.max(1) as i128);
            let (bh, bs) = (b.hits(metric) as i128, b.sent.max(1) as i128);
            th * bs > bh * ts
        });
        if better {
            best = Some(t);
        }
    }
    best.map_or(0, |t| t.variant)
}

/// Pick the winner if the wait is over and the campaign is running (not
/// paused, not cancelled), once: the write only happens where no winner
/// is stored, so two workers deciding at once agree on the first. Returns
/// the test as stored afterwards.
pub fn decide(conn: &mut Conn, test: &AbTest, variants: i64, now: i64) -> Result<Option<AbTest>> {
    let id = test.campaign_id;
    let winner = best(&tallies(conn, id, variants)?, test.metric);
    let query = format!(
        "UPDATE campaign_ab SET winner = {winner}, decided_at = {now} \
         WHERE campaign_id = {id} AND winner IS NULL AND started_at IS NOT NULL \
         AND started_at + wait_ms <= {now} \
         AND EXISTS (SELECT 1 FROM campaigns WHERE id = {id} AND paused = FALSE \
         AND state <> 'cancelled')"
    );
    on!(conn, |c| diesel::sql_query(&query).execute(c))?;
    get(conn, id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test(permille: i64, winner: Option<i64>) -> AbTest {
        AbTest {
            campaign_id: 1,
            sample_permille: permille,
            wait_ms: 1000,
            metric: Metric::Clicks,
            seed: 42,
            started_at: None,
            winner,
            decided_at: None,
        }
    }

    #[test]
    fn the_sample_is_drawn_at_random_and_split_evenly() {
        let t = test(200, None);
        let got: Vec<Assigned> = (1..=10_000).map(|r| t.assign(r, 2)).collect();
        let sample: Vec<i64> = got
            .iter()
            .filter_map(|a| match a {
                Assigned::Variant(v) => Some(*v),
                Assigned::Held => None,
            })
            .collect();
        assert!((1_850..=2_150).contains(&sample.len()), "{}", sample.len());
        let b = sample.iter().filter(|v| **v == 1).count();
        assert!(
            (sample.len() / 2).abs_diff(b) < 150,
            "{b} of {}",
            sample.len()
        );
        // Not the first ids: the first 200 are not all in.
        assert!(got[..200].contains(&Assigned::Held));
        // Another seed draws another sample.
        let other = AbTest {
            seed: 43,
            ..t.clone()
        };
        assert!((1..=200)
            .any(|r| (t.assign(r, 2) == Assigned::Held) != (other.assign(r, 2) == Assigned::Held)));
    }

    #[test]
    fn after_the_decision_the_rest_get_the_winner_and_the_sample_keeps_its_own() {
        let open = test(200, None);
        let done = test(200, Some(1));
        for r in 1..=2_000 {
            match (open.assign(r, 3), done.assign(r, 3)) {
                (Assigned::Held, got) => assert_eq!(got, Assigned::Variant(1)),
                (own, got) => assert_eq!(own, got),
            }
        }
    }

    #[test]
    fn the_best_rate_wins_and_a_tie_goes_to_a() {
        let t = |variant, sent, clicked| Tally {
            variant,
            sent,
            opened: 0,
            clicked,
        };
        assert_eq!(best(&[t(0, 100, 10), t(1, 50, 6)], Metric::Clicks), 1);
        assert_eq!(best(&[t(0, 100, 10), t(1, 50, 5)], Metric::Clicks), 0);
        assert_eq!(best(&[t(0, 0, 0), t(1, 0, 0)], Metric::Clicks), 0);
        assert_eq!(
            best(&[t(0, 10, 1), t(1, 10, 1), t(2, 10, 2)], Metric::Clicks),
            2
        );
        assert_eq!(best(&[t(0, 10, 1), t(1, 10, 9)], Metric::Opens), 0);
    }
}
