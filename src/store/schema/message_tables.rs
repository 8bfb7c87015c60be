//! The message templates' and messages' tables (see the parent module).

diesel::table! {
    /// Message templates, one row each, at their latest version.
    message_templates (id) {
        id -> BigInt,
        name -> Text,
        stream -> Text,
        version -> BigInt,
        subject -> Text,
        from_addr -> Text,
        html -> Text,
        text_body -> Text,
        created_at -> BigInt,
        updated_at -> BigInt,
        return_path -> Nullable<Text>,
        track -> Text,
        public_url -> Nullable<Text>,
    }
}

diesel::table! {
    /// Opens and clicks per message (message-template mail that tracks).
    message_engagement (message_id) {
        message_id -> BigInt,
        first_open_at -> Nullable<BigInt>,
        opens -> BigInt,
        first_machine_open_at -> Nullable<BigInt>,
        machine_opens -> BigInt,
        first_click_at -> Nullable<BigInt>,
        clicks -> BigInt,
    }
}

diesel::table! {
    /// The transactional messages ledger.
    messages (id) {
        id -> BigInt,
        template_id -> BigInt,
        template_name -> Text,
        to_addr -> Text,
        data -> Text,
        idempotency_key -> Nullable<Text>,
        body_hash -> Text,
        status -> Text,
        attempts -> BigInt,
        claim_token -> Nullable<BigInt>,
        claimed_until -> BigInt,
        reply -> Nullable<Text>,
        created_at -> BigInt,
        sent_at -> Nullable<BigInt>,
        /// When a waiting message's next attempt is due (see
        /// `store::messages_sweep`).
        next_attempt_at -> BigInt,
    }
}
