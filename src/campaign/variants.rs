//! An A/B test's variants B, C, … as `campaign create` checks them:
//! `--variant-subject` and `--variant-html` pair up in order (B gets the
//! first of each), and a variant missing one of them has variant A's. A
//! variant's HTML goes through exactly what the campaign's own content
//! does ([`super::content::prepare`]: the same Jinja checks and errors,
//! links refused, CSS inlined, the text part derived) and gets a link
//! table of its own ([`super::tracking_of`]), so a click on its links
//! credits it and goes where its own HTML said.

use std::path::PathBuf;

use super::content::{self, ContentSource};
use super::CampaignError;
use crate::compose::content::{Compiled, Sources};
use crate::store::ab::{NewVariant, VariantContent};
use crate::store::content::Track;

/// Most variants a test may have (A included).
pub const MAX_VARIANTS: usize = 10;

/// What checking the A/B options needs of the campaign itself.
#[derive(Debug, Clone, Copy)]
pub struct Main<'a> {
    pub name: &'a str,
    /// `--subject`: variant A's, and that of a variant without its own.
    pub subject: &'a str,
    pub track: Track,
    pub public_url: Option<&'a str>,
}

fn bad(why: impl Into<String>) -> CampaignError {
    CampaignError::Bad(why.into())
}

/// The variants to store, B first, and the warnings about their content.
pub(super) fn check(
    variant_subjects: &[String],
    variant_html: &[PathBuf],
    main: &Main,
) -> Result<(Vec<NewVariant>, Vec<String>), CampaignError> {
    let count = variant_subjects.len().max(variant_html.len());
    if count == 0 {
        return Err(bad(
            "an A/B test needs at least one variant besides the campaign's own content (variant A): add --variant-subject \"Another subject\" and/or --variant-html FILE (both repeatable)",
        ));
    }
    if count + 1 > MAX_VARIANTS {
        return Err(bad(format!(
            "{count} variants besides A: at most {} (B to J); give at most {0} --variant-subject and at most {0} --variant-html",
            MAX_VARIANTS - 1
        )));
    }
    for s in variant_subjects {
        check_subject(s, main.name)?;
    }
    let mut warnings = Vec::new();
    let mut variants = Vec::with_capacity(count);
    for i in 0..count {
        let subject = variant_subjects.get(i).cloned();
        let content = match variant_html.get(i) {
            Some(html) => {
                let subject = subject.as_deref().unwrap_or(main.subject);
                let (own, warned) = own_content(html, subject, main)?;
                warnings.extend(warned);
                Some(own)
            }
            None => None,
        };
        variants.push(NewVariant { subject, content });
    }
    Ok((variants, warnings))
}

/// `--variant-subject` is one line that compiles as a subject template.
fn check_subject(subject: &str, campaign: &str) -> Result<(), CampaignError> {
    if subject.trim().is_empty() || subject.chars().any(char::is_control) {
        return Err(bad("--variant-subject must be one non-empty line"));
    }
    let sources = Sources {
        subject: ("--variant-subject", subject),
        body: None,
    };
    Compiled::new(&sources, campaign).map_err(|e| bad(e.to_string()))?;
    Ok(())
}

/// One `--variant-html FILE`, prepared and tracked as the campaign's own
/// content would be.
fn own_content(
    html: &std::path::Path,
    subject: &str,
    main: &Main,
) -> Result<(VariantContent, Vec<String>), CampaignError> {
    let source = ContentSource::Html {
        html: html.to_path_buf(),
        text: None,
    };
    let prepared = content::prepare(main.name, subject, &source)?;
    let tracking = super::tracking_of(
        (prepared.kind, &prepared.label),
        (&prepared.html, &prepared.text),
        main.track,
        main.public_url,
    )?;
    let own = VariantContent {
        kind: prepared.kind,
        subject: prepared.subject,
        html: prepared.html,
        text: prepared.text,
        tracking,
    };
    Ok((own, prepared.warnings))
}
