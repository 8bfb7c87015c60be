//! The parsed command line never shows a password.

use super::*;

#[test]
fn debug_of_the_parsed_command_line_hides_passwords() {
    let cli = Cli::try_parse_from([
        "mailsplit",
        "--database-url",
        "postgres://me:DbS3cret@db/x",
        "worker",
        "--smtp",
        "smtps://u:SmtpS3cret@relay:465",
    ])
    .unwrap();
    let shown = format!("{cli:?} {cli:#?}");
    assert!(!shown.contains("DbS3cret"), "{shown}");
    assert!(!shown.contains("SmtpS3cret"), "{shown}");
    assert!(shown.contains("relay:465"), "{shown}");
}

#[test]
fn debug_of_an_sql_import_hides_the_source_password() {
    let cli = Cli::try_parse_from([
        "mailsplit",
        "import",
        "--list",
        "shop",
        "--from-sql",
        "SELECT email FROM customers",
        "--source",
        "postgres://shop:SrcS3cret@db/shop",
    ])
    .unwrap();
    let shown = format!("{cli:?} {cli:#?}");
    assert!(!shown.contains("SrcS3cret"), "{shown}");
    assert!(shown.contains("customers"), "{shown}");
}
