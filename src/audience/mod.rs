//! Who a campaign goes to: recipients loaded from a CSV or the shop's own
//! database ([`import`], [`source`]), the lists they are on ([`lists`]),
//! and everyone who asked not to be mailed or cannot be ([`optouts`]).

pub mod confirm_mail;
pub mod import;
pub mod lists;
pub mod optouts;
pub mod preferences;
pub mod source;
pub mod subscribe;
pub mod subscriber;
pub mod suppress;
