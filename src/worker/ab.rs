//! A/B tests in the worker. Jobs are enqueued as usual; while the test is
//! undecided a job's sample members are claimed and sent (each with its
//! own variant, a keyed hash of the recipient, see `store::ab`) and the
//! rest are left unclaimed: the job goes back once, delayed until the
//! decision time (a job with no sample member goes back at once, without
//! a claim). The first worker that meets the campaign running after the
//! wait writes the winner, once, in the database; from then on every other
//! recipient gets the winner. Nothing here runs while the campaign is
//! paused: the job's checks send a paused campaign's job back first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::compose::{CampaignMail, ComposeError};
use crate::store::ab::{self, AbTest, Assigned};
use crate::store::{now_ms, Campaign, Conn, Db, StoreError};

/// A campaign's test as a worker holds it.
pub struct AbPlan {
    /// Variants B, C, … composed (A is the campaign's own mail).
    pub others: Vec<CampaignMail>,
    /// The test once it has a winner (it never changes after).
    decided: Mutex<Option<AbTest>>,
}

impl AbPlan {
    /// How many variants, A included.
    pub fn variants(&self) -> i64 {
        self.others.len() as i64 + 1
    }

    /// The same plan with `dkim` signing every variant.
    pub fn with_dkim(&self, dkim: &Arc<[Arc<crate::dkim::SigningKey>]>) -> AbPlan {
        AbPlan {
            others: self
                .others
                .iter()
                .map(|m| CampaignMail {
                    dkim: Arc::clone(dkim),
                    ..m.clone()
                })
                .collect(),
            decided: Mutex::new(self.decided()),
        }
    }

    fn decided(&self) -> Option<AbTest> {
        self.decided
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Load a campaign's test with its variants composed; `None` if it has
/// none.
pub fn load(
    conn: &mut Conn,
    c: &Campaign,
    mail: &CampaignMail,
) -> Result<Option<AbPlan>, ComposeError> {
    if ab::get(conn, c.id)?.is_none() {
        return Ok(None);
    }
    let mut others = Vec::new();
    for v in ab::variants(conn, c.id)? {
        let variant = mail
            .variant(conn, c, &v)?
            .ok_or_else(|| StoreError::BadValue {
                what: "campaign content",
                value: format!("campaign {:?} changed while its variants loaded", c.name),
            })?;
        others.push(variant);
    }
    Ok(Some(AbPlan {
        others,
        decided: Mutex::new(None),
    }))
}

/// What a job does with its recipients under the test.
#[derive(Debug, Default)]
pub struct Split {
    /// The recipients to claim now, each with its variant.
    pub claim: Vec<i64>,
    pub variants: HashMap<i64, i64>,
    /// Some were held back: the job comes back at this time (ms).
    pub held_until: Option<i64>,
}

/// Split a job's recipients: the test is started (its wait begins with
/// the first job a worker meets) and, once the wait is over, decided.
pub async fn split(db: &Arc<Db>, plan: &AbPlan, id: i64, ids: &[i64]) -> Result<Split, StoreError> {
    let variants = plan.variants();
    let test = match plan.decided() {
        Some(t) => t,
        None => {
            let now = now_ms();
            let test = db
                .run(move |c| {
                    let Some(t) = ab::start(c, id, now)? else {
                        return Ok(None);
                    };
                    match t.decide_at() {
                        Some(at) if t.winner.is_none() && at <= now => {
                            ab::decide(c, &t, variants, now)
                        }
                        _ => Ok(Some(t)),
                    }
                })
                .await?;
            let Some(test) = test else {
                // The test is gone (never, short of a hand edit): send A.
                return Ok(Split {
                    claim: ids.to_vec(),
                    ..Split::default()
                });
            };
            if let Some(w) = test.winner {
                tracing::info!(
                    campaign = id,
                    winner = %ab::variant_name(w),
                    "A/B test decided: the winner goes to the rest of the list"
                );
                *plan.decided.lock().unwrap_or_else(|p| p.into_inner()) = Some(test.clone());
            }
            test
        }
    };
    let mut split = Split::default();
    for &rid in ids {
        match test.assign(rid, variants) {
            Assigned::Variant(v) => {
                split.claim.push(rid);
                split.variants.insert(rid, v);
            }
            Assigned::Held => {
                let until = test.decide_at().unwrap_or_else(|| now_ms() + test.wait_ms);
                split.held_until = Some(until);
            }
        }
    }
    Ok(split)
}

/// The recipients of `variants` grouped by variant, for the ledger.
pub fn groups(variants: &HashMap<i64, i64>, owned: &[(i64, i32)]) -> Vec<(i64, Vec<i64>)> {
    let mut by: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
    for (rid, _) in owned {
        if let Some(v) = variants.get(rid) {
            by.entry(*v).or_default().push(*rid);
        }
    }
    by.into_iter().collect()
}

/// How long a job whose recipients are held back for an A/B test's
/// decision at `until` (ms) waits: until a moment after it.
pub(super) fn held_delay(until: i64) -> std::time::Duration {
    std::time::Duration::from_millis((until - crate::store::now_ms()).max(0) as u64 + 500)
}
