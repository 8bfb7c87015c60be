//! Rebuild when a migration is added or changed: `embed_migrations!` in
//! `src/store/mod.rs` reads `migrations/` at compile time, and cargo does
//! not know it does (diesel_migrations' documented build script).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
