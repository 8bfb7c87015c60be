//! `mailsplit rate warmup`'s arguments, as clap sees them.

use clap::Args;

/// Start a group slow and let it grow day by day, or end that.
#[derive(Args, Debug)]
pub struct WarmupArgs {
    /// relay:HOST:PORT, campaign:NAME, domain:DOMAIN or domain:*
    pub group: String,
    /// Day 0's rate, e.g. 200/d (N/s, N/m, N/h or N/d)
    #[arg(long, required_unless_present = "off", conflicts_with = "off")]
    pub start: Option<String>,
    /// Each day's rate is the day before's times this (1 to 10)
    #[arg(long, default_value_t = 1.5, conflicts_with = "off")]
    pub factor: f64,
    /// Length of a warm-up day: N followed by s, m, h or d
    #[arg(long, default_value = "1d", conflicts_with = "off")]
    pub every: String,
    /// The rate the schedule ends at, e.g. 100000/d
    #[arg(long, required_unless_present = "off", conflicts_with = "off")]
    pub until: Option<String>,
    /// End the group's warm-up (the group keeps its rate)
    #[arg(long)]
    pub off: bool,
}
