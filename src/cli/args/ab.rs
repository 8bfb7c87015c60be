//! `campaign create`'s A/B test options, as clap sees them.

use clap::Args;

/// A/B test: variants of the subject and/or the HTML, a sample that tests
/// them, and the winner sent to the rest of the list, unattended
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "A/B test")]
pub struct AbArgs {
    /// Another subject line to test against --subject (which is variant
    /// A); repeatable: B, C, … Needs --ab-sample and --ab-wait
    #[arg(long = "variant-subject", value_name = "SUBJECT")]
    pub variant_subjects: Vec<String>,
    /// HTML to test against the campaign's own (variant A's); repeatable:
    /// B, C, … paired in order with --variant-subject (a variant without
    /// one has A's). Checked as --html is; the text part is made from it
    #[arg(long = "variant-html", value_name = "FILE")]
    pub variant_html: Vec<std::path::PathBuf>,
    /// Share of the list that tests the variants, 1% to 50%: drawn at
    /// random and split into equal parts, one variant each
    #[arg(long, value_name = "PERCENT")]
    pub ab_sample: Option<String>,
    /// How long the sample is watched from the first send before the
    /// variant with the best rate goes to everyone else: 30m, 2h, 1d
    #[arg(long, value_name = "DURATION")]
    pub ab_wait: Option<String>,
    /// What picks the winner: unique opens or unique clicks per sent
    /// message (A on a tie); needs --track of the same [default: opens]
    #[arg(long, value_name = "opens|clicks")]
    pub ab_metric: Option<String>,
}

impl AbArgs {
    /// The stage's request.
    pub fn request(self) -> crate::campaign::ab::AbRequest {
        crate::campaign::ab::AbRequest {
            variant_subjects: self.variant_subjects,
            variant_html: self.variant_html,
            sample: self.ab_sample,
            wait: self.ab_wait,
            metric: self.ab_metric,
        }
    }
}
