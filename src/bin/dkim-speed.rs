//! `dkim-speed [SECONDS]`: how fast each RSA-2048 implementation at hand
//! signs on one core, beside mailsplit's own signer (canonicalization and
//! header included) and ed25519. The measure behind the choice of OpenSSL
//! in src/dkim.rs; `scripts/bench.sh --dkim-compare` runs it. Built with
//! `--features speed-aws-lc`, it measures aws-lc-rs too. Not a test:
//! nothing here asserts a speed.

use std::time::{Duration, Instant};

use data_encoding::BASE64;
use mailsplit::dkim::{self, DkimAlgorithm, SigningKey, StoredKey};

/// A message of the size a campaign sends (headers and a short body).
fn message() -> Vec<u8> {
    let mut m = String::from(
        "From: Shop <news@example.test>\r\nTo: Ada <ada@example.test>\r\n\
         Subject: Benchmark news\r\nDate: Thu, 26 Nov 2026 11:00:00 +0000\r\n\
         Message-ID: <1.2.3@example.test>\r\nMIME-Version: 1.0\r\n\
         List-Unsubscribe: <https://mail.example.test/u/abc>\r\n\
         List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\r\n",
    );
    for k in 0..40 {
        m.push_str(&format!(
            "Line {k} of the newsletter body, as a campaign sends it.\r\n"
        ));
    }
    m.into_bytes()
}

/// This thread's CPU time.
fn cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Run `sign` for `secs` of wall time; print signs per second of wall
/// time and CPU time per signature (less sensitive to a busy machine).
fn measure(name: &str, secs: f64, mut sign: impl FnMut()) {
    sign(); // warm up
    let (wall, cpu0) = (Instant::now(), cpu());
    let mut n = 0u64;
    while wall.elapsed().as_secs_f64() < secs {
        sign();
        n += 1;
    }
    let elapsed = wall.elapsed().as_secs_f64();
    let per = (cpu() - cpu0).as_secs_f64() / n as f64;
    println!(
        "{name:<34} {:>8.0} signs/s  {:>8.1} us CPU/sign  ({n} signs)",
        n as f64 / elapsed,
        per * 1e6
    );
}

fn main() -> anyhow::Result<()> {
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2.0);
    let msg = message();
    let digest_input = &msg[..600];
    let rsa = dkim::generate(DkimAlgorithm::Rsa)?;
    raw_rsa(&rsa.private_pkcs8, digest_input, secs)?;

    for (algorithm, key) in [
        (DkimAlgorithm::Rsa, rsa),
        (
            DkimAlgorithm::Ed25519,
            dkim::generate(DkimAlgorithm::Ed25519)?,
        ),
    ] {
        let stored = StoredKey::new(
            "example.test".into(),
            "bench".into(),
            algorithm,
            BASE64.encode(&key.private_pkcs8),
            BASE64.encode(&key.public),
        );
        let signer = SigningKey::load(&stored)?;
        measure(
            &format!("mailsplit DKIM-Signature {algorithm}"),
            secs,
            || {
                signer.signature(&msg, 1).expect("sign");
            },
        );
    }
    Ok(())
}

/// RSA-2048 signatures by each library, on the same input: what a
/// DKIM signature's RSA step costs apart from mailsplit's own work.
fn raw_rsa(pkcs8: &[u8], digest_input: &[u8], secs: f64) -> anyhow::Result<()> {
    let pkey = openssl::pkey::PKey::private_key_from_pkcs8(pkcs8)?;

    measure("rsa2048 openssl (Signer)", secs, || {
        let mut s = openssl::sign::Signer::new(openssl::hash::MessageDigest::sha256(), &pkey)
            .expect("signer");
        s.update(digest_input).expect("update");
        s.sign_to_vec().expect("sign");
    });

    let ring_key =
        ring::signature::RsaKeyPair::from_pkcs8(pkcs8).map_err(|e| anyhow::anyhow!("ring: {e}"))?;
    let rng = ring::rand::SystemRandom::new();
    let mut sig = vec![0u8; ring_key.public().modulus_len()];
    measure("rsa2048 ring", secs, || {
        ring_key
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &rng,
                digest_input,
                &mut sig,
            )
            .expect("sign");
    });

    #[cfg(feature = "speed-aws-lc")]
    {
        let aws = aws_lc_rs::signature::RsaKeyPair::from_pkcs8(pkcs8)
            .map_err(|e| anyhow::anyhow!("aws-lc-rs: {e}"))?;
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let mut sig = vec![0u8; aws.public_modulus_len()];
        measure("rsa2048 aws-lc-rs", secs, || {
            aws.sign(
                &aws_lc_rs::signature::RSA_PKCS1_SHA256,
                &rng,
                digest_input,
                &mut sig,
            )
            .expect("sign");
        });
    }

    Ok(())
}
