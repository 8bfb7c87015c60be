//! `World`: one test's whole setting in one value (a temp dir, a
//! beanstalkd with its binlog there, an optional scripted SMTP peer, a
//! fresh SQLite or PostgreSQL database, and the environment every command
//! of the test runs with), torn down in the right order when dropped.
//! It replaces the `(_tmp, _bs, …)` guard tuples: a test holds one value,
//! and cannot drop the beanstalkd its workers still talk to by naming a
//! guard `_`.

use std::ops::{Deref, DerefMut};

use super::*;

/// One test's servers, database and environment. Derefs to its [`Env`].
pub struct World {
    // why this order: fields drop top to bottom; the database (in `env`)
    // and the peer go first, beanstalkd next, its binlog's directory last
    pub env: Env,
    peer: Option<ScriptedSmtp>,
    pub bs: Beanstalkd,
    _tmp: tempfile::TempDir,
}

impl World {
    /// A beanstalkd and a fresh database of `kind`; SMTP points nowhere.
    pub fn new(kind: Kind) -> World {
        let tmp = tempfile::tempdir().unwrap();
        let bs = Beanstalkd::start(tmp.path());
        let env = Env::new(kind, &bs.addr());
        World {
            env,
            peer: None,
            bs,
            _tmp: tmp,
        }
    }

    /// As [`World::new`], with a scripted SMTP peer the commands send to.
    pub fn with_peer(kind: Kind, script: Script) -> World {
        let mut world = World::new(kind);
        let peer = ScriptedSmtp::start(script);
        world.env.smtp = peer.url();
        world.peer = Some(peer);
        world
    }

    /// Every command of this world runs with `key=value` too (the hidden
    /// test knobs such as `MAILSPLIT_LEASE_MS`).
    pub fn var(mut self, key: &str, value: &str) -> World {
        self.env.vars.push((key.to_string(), value.to_string()));
        self
    }

    /// The scripted peer; a test that asks for it without
    /// [`World::with_peer`] is wrong, so it panics.
    pub fn peer(&self) -> &ScriptedSmtp {
        self.peer
            .as_ref()
            .expect("World::peer: this world was made without a peer (World::with_peer)")
    }
}

impl Deref for World {
    type Target = Env;
    fn deref(&self) -> &Env {
        &self.env
    }
}

impl DerefMut for World {
    fn deref_mut(&mut self) -> &mut Env {
        &mut self.env
    }
}
