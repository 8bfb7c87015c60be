//! `mailsplit report CAMPAIGN [--json]`: the report stage's figures as
//! text tables, or as one JSON object.

use crate::campaign::report::{self, Activity, Report};
use crate::cli::args::Global;
use crate::cli::exit::UsageError;
use crate::cli::out::outln;

use super::{open_read_only, Result};

/// Domains shown at most (`--top`).
const MAX_TOP: usize = 1_000;

pub fn report(g: &Global, campaign: &str, json: bool, top: usize) -> Result {
    if top == 0 || top > MAX_TOP {
        return Err(UsageError(format!("--top must be between 1 and {MAX_TOP}, got {top}")).into());
    }
    let r = report::build(&mut open_read_only(g)?, campaign, top)?;
    if json {
        outln!("{}", serde_json::to_string(&r)?)?;
        return Ok(());
    }
    print_summary(&r)?;
    print_domains(&r)?;
    print_reasons(&r)?;
    print_tracking(&r)?;
    print_ab(&r)?;
    print_versions_and_rate(&r)
}

/// Each variant's rate with its 95 % interval, and whether the lead means
/// anything.
fn print_ab(r: &Report) -> Result {
    let Some(ab) = &r.ab else {
        return Ok(());
    };
    let winner = ab.winner.as_deref().unwrap_or("not decided yet");
    outln!(
        "
A/B test ({}% sample, {}s wait, by {}): winner {winner}",
        ab.sample_percent,
        ab.wait_seconds,
        ab.metric
    )?;
    outln!(
        "  {:<7} {:>9} {:>9} {:>7}  {:<17}  subject",
        "variant",
        "sent",
        ab.metric,
        "rate",
        "95% interval"
    )?;
    for v in &ab.variants {
        outln!(
            "  {:<7} {:>9} {:>9} {:>6.1}%  {:>6.1}% – {:>5.1}%  {}",
            v.name,
            v.sent,
            v.hits,
            v.rate * 100.0,
            v.low * 100.0,
            v.high * 100.0,
            v.subject
        )?;
    }
    outln!("  {}", ab.verdict)?;
    Ok(())
}

fn print_tracking(r: &Report) -> Result {
    let Some(t) = &r.tracking else {
        return Ok(());
    };
    let e = &t.counts;
    outln!("\ntracking ({}):", t.tracks)?;
    outln!(
        "  opened {} ({} opens; machine {} ({} opens))  clicked {} ({} clicks)  unsubscribed {}",
        e.opened,
        e.opens,
        e.machine_opened,
        e.machine_opens,
        e.clicked,
        e.clicks,
        e.unsubscribed
    )?;
    print_template_links(t)?;
    if t.links.is_empty() {
        return Ok(());
    }
    outln!("\nclicks per link:")?;
    outln!("  {:>7} {:>5} {:>9}  url", "version", "link", "clicks")?;
    for l in &t.links {
        outln!(
            "  {:>7} {:>5} {:>9}  {}",
            l.version,
            l.link,
            l.clicks,
            l.url
        )?;
    }
    Ok(())
}

/// Clicks on links the template wrote, most clicked first.
fn print_template_links(t: &Activity) -> Result {
    if t.template_links.is_empty() {
        return Ok(());
    }
    outln!(
        "\nclicks on links from the template ({} distinct URLs):",
        t.template_urls_clicked
    )?;
    for l in &t.template_links {
        outln!("  {:>9}  {}", l.clicks, l.url)?;
    }
    let more = t.template_urls_clicked - t.template_links.len() as i64;
    if more > 0 {
        outln!("  … and {more} more (fewer clicks each)")?;
    }
    Ok(())
}

fn print_summary(r: &Report) -> Result {
    let s = &r.status;
    outln!(
        "{}  {}  recipients {}  sent {}  failed {}  skipped {}  pending {}",
        s.name,
        s.state,
        s.recipients,
        s.sent,
        s.failed,
        s.skipped,
        s.pending
    )?;
    outln!(
        "bounced {}  complaints {}  unsubscribed {}",
        s.bounced,
        s.complaints,
        r.unsubscribed
    )?;
    Ok(())
}

fn print_domains(r: &Report) -> Result {
    outln!("\nby recipient domain:")?;
    outln!(
        "  {:<32} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "domain",
        "recips",
        "sent",
        "failed",
        "skipped",
        "bounced",
        "complain",
        "unsub"
    )?;
    for d in &r.domains {
        outln!(
            "  {:<32} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            d.domain,
            d.recipients,
            d.sent,
            d.failed,
            d.skipped,
            d.bounced,
            d.complaints,
            d.unsubscribed
        )?;
    }
    Ok(())
}

fn print_reasons(r: &Report) -> Result {
    if !r.skipped_reasons.is_empty() {
        outln!("\nskipped:")?;
        for s in &r.skipped_reasons {
            outln!("  {:>7}  {}", s.count, s.reason)?;
        }
    }
    if r.bounce_reasons.is_empty() {
        return Ok(());
    }
    outln!("\ntop bounce reasons:")?;
    for reason in &r.bounce_reasons {
        outln!(
            "  {:>7}  {:<7} {:<6} {}",
            reason.count,
            reason.code.as_deref().unwrap_or("-"),
            reason.source,
            reason.text
        )?;
    }
    Ok(())
}

fn print_versions_and_rate(r: &Report) -> Result {
    if !r.versions_sent.is_empty() {
        let v: Vec<String> = r
            .versions_sent
            .iter()
            .map(|v| format!("v{} {}", v.version, v.sent))
            .collect();
        outln!("\ncontent versions sent: {}", v.join(", "))?;
    }
    if !r.rate_per_minute.is_empty() {
        outln!("\nper minute (UTC):          sent   failed")?;
        for m in &r.rate_per_minute {
            outln!("  {:<22} {:>7} {:>8}", m.minute, m.sent, m.failed)?;
        }
    }
    Ok(())
}
