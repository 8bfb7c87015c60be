//! The phase and pace `status` shows, worked out from a campaign's stored
//! state and counters.

use super::*;

const NOW: i64 = 1_700_000_000_000;

fn counters(recipients: i64, sent: i64) -> Counters {
    Counters {
        campaign_id: 1,
        recipients,
        enqueued: recipients,
        jobs: 1,
        sent,
        failed: 0,
        skipped: 0,
        enqueue_skipped: 0,
        window_at: 0,
        window_done: 0,
        rate: 0.0,
        first_at: None,
        last_at: None,
        bounced: 0,
        complaints: 0,
        fail_streak: 0,
        recent_done: 0,
        recent_failed: 0,
        prior_done: 0,
        prior_failed: 0,
    }
}

#[test]
fn cancelled_and_paused_win_over_the_start_time_and_the_counters() {
    use CampaignState::*;
    assert_eq!(phase(Cancelled, true, true, 5), Phase::Cancelled);
    assert_eq!(phase(Queued, true, true, 0), Phase::Paused);
    assert_eq!(phase(Draft, false, true, 5), Phase::Scheduled);
    assert_eq!(phase(Queued, false, true, 0), Phase::Scheduled);
    assert_eq!(phase(Draft, false, false, 5), Phase::Draft);
    assert_eq!(phase(Enqueuing, false, false, 0), Phase::Enqueuing);
    assert_eq!(phase(Queued, false, false, 0), Phase::Done);
    assert_eq!(phase(Queued, false, false, 3), Phase::Sending);
}

#[test]
fn the_rate_and_eta_are_shown_only_while_sending_recently() {
    let mut c = counters(1_000, 400);
    c.rate = 33.33;
    c.first_at = Some(NOW - 20_000);
    c.last_at = Some(NOW - 100);
    let sending = Pace::of(&c, Phase::Sending, NOW);
    assert_eq!(
        sending,
        Pace {
            rate: 33.3,
            avg_rate: 20.1,
            eta_seconds: Some(19),
        }
    );
    let paused = Pace::of(&c, Phase::Paused, NOW);
    assert_eq!((paused.rate, paused.eta_seconds), (0.0, None));
    assert_eq!(paused.avg_rate, 20.1);
    let idle = Pace::of(&c, Phase::Sending, NOW + 2 * rate_window_ms());
    assert_eq!((idle.rate, idle.eta_seconds), (0.0, None));
}

#[test]
fn nothing_finished_yet_is_no_pace_at_all() {
    let c = counters(10, 0);
    let pace = Pace::of(&c, Phase::Sending, NOW);
    assert_eq!(
        pace,
        Pace {
            rate: 0.0,
            avg_rate: 0.0,
            eta_seconds: None,
        }
    );
}
