//! The adapted rate's steps, by the numbers.

use super::*;

#[test]
fn recovery_is_quick_far_under_the_last_throttle_and_slow_near_it() {
    // Configured 3000/s, cut to 150/s after a throttle at 300/s.
    let f = recovered_factor(3000.0, 0.05, 300.0);
    assert!((f * 3000.0 - 225.0).abs() < 1e-6, "{}", f * 3000.0);
    // Never past 90 % of the throttle's rate in a quick step...
    let f = recovered_factor(3000.0, 260.0 / 3000.0, 300.0);
    assert!((f * 3000.0 - 270.0).abs() < 1e-6, "{}", f * 3000.0);
    // ...then small steps, up to a tenth past it...
    let f = recovered_factor(3000.0, 0.09, 300.0);
    assert!((f * 3000.0 - 275.4).abs() < 1e-6, "{}", f * 3000.0);
    let f = recovered_factor(3000.0, 0.1, 300.0);
    assert!((f * 3000.0 - 306.0).abs() < 1e-6, "{}", f * 3000.0);
    // ...and quick again beyond: the quota was raised.
    let f = recovered_factor(3000.0, 0.11, 300.0);
    assert!((f * 3000.0 - 412.5).abs() < 1e-6, "{}", f * 3000.0);
    // Never above the configured rate.
    assert_eq!(recovered_factor(3000.0, 0.99, 300.0), 1.0);
    assert_eq!(recovered_factor(100.0, 0.5, 0.0), 0.625);
}

#[test]
fn a_throttle_after_a_clean_step_cuts_less_than_one_on_the_way_down() {
    assert_eq!(cut_factor(0.5, false), 0.25);
    assert!((cut_factor(0.5, true) - 0.4).abs() < 1e-12);
    assert_eq!(cut_factor(MIN_FACTOR, false), MIN_FACTOR);
}
