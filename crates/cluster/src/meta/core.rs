//! The etcd calls of the cluster's metadata: each bounded by the request
//! timeout, run on the metadata client's small tokio runtime and waited for
//! on a std channel (callable from any thread).
//!
//! Invariants: no call waits longer than the request timeout (plus a second
//! for the answer to reach the caller); a transaction's compares and
//! operations are sent as given, never split.

use super::{CoordinatorTerm, MetaError};
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use std::future::Future;
use std::sync::mpsc;
use std::time::Duration;

pub(super) struct Core {
    pub(super) client: Client,
    pub(super) prefix: String,
    pub(super) endpoints: String,
    pub(super) timeout: Duration,
    pub(super) handle: tokio::runtime::Handle,
    pub(super) runtime: parking_lot::Mutex<Option<tokio::runtime::Runtime>>,
}

impl Drop for Core {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.lock().take() {
            rt.shutdown_background();
        }
    }
}

impl Core {
    pub(super) fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// Runs `f` on the runtime and waits for it, bounded by the timeout.
    pub(super) fn call<T, F, Fut>(&self, key: &str, f: F) -> Result<T, MetaError>
    where
        T: Send + 'static,
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, MetaError>> + Send + 'static,
    {
        let fut = f(self.client.clone());
        let (tx, rx) = mpsc::sync_channel(1);
        let timeout = self.timeout;
        self.handle.spawn(async move {
            let r = tokio::time::timeout(timeout, fut).await.ok();
            let _ = tx.send(r);
        });
        let timed_out = || MetaError::Timeout {
            endpoints: self.endpoints.clone(),
            key: key.to_string(),
            timeout,
        };
        match rx.recv_timeout(timeout + Duration::from_secs(1)) {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => Err(timed_out()),
        }
    }

    pub(super) fn request_error(
        &self,
        key: &str,
    ) -> impl Fn(etcd_client::Error) -> MetaError + Send + 'static {
        let endpoints = self.endpoints.clone();
        let key = key.to_string();
        move |source| MetaError::Request {
            endpoints: endpoints.clone(),
            key: key.clone(),
            source,
        }
    }

    /// Every key/value under `prefix`, with each key's mod_revision.
    pub(super) fn list(&self, prefix: &str) -> Result<Vec<Listed>, MetaError> {
        let key = self.key(prefix);
        let err = self.request_error(&key);
        let k = key.clone();
        self.call(&key, move |mut c| async move {
            let resp = c
                .get(k, Some(GetOptions::new().with_prefix()))
                .await
                .map_err(&err)?;
            Ok(listed(resp.kvs()))
        })
    }

    /// The value and mod_revision of one key.
    pub(super) fn get(&self, rest: &str) -> Result<Option<(Vec<u8>, i64)>, MetaError> {
        Ok(self.get_kv(rest)?.map(|kv| (kv.value, kv.mod_revision)))
    }

    /// One key with both its revisions.
    fn get_kv(&self, rest: &str) -> Result<Option<StoredKey>, MetaError> {
        let key = self.key(rest);
        let err = self.request_error(&key);
        let k = key.clone();
        self.call(&key, move |mut c| async move {
            let resp = c.get(k, None).await.map_err(&err)?;
            Ok(resp.kvs().first().map(|kv| StoredKey {
                value: kv.value().to_vec(),
                mod_revision: kv.mod_revision(),
                create_revision: kv.create_revision(),
            }))
        })
    }

    /// Puts `value` at `rest` if the key's mod_revision is `expected` (0:
    /// absent). Returns whether it was applied.
    pub(super) fn put_if(
        &self,
        rest: &str,
        expected: i64,
        value: Vec<u8>,
    ) -> Result<bool, MetaError> {
        self.txn_put(vec![(rest.to_string(), expected, value)])
    }

    /// The fence of a coordinator's write: its election key still exists
    /// with the create revision of `term`.
    pub(super) fn fence(&self, term: CoordinatorTerm) -> Compare {
        Compare::create_revision(self.key("coordinator"), CompareOp::Equal, term.0)
    }

    /// Runs `then` if every compare in `when` holds; whether it did.
    pub(super) fn txn(
        &self,
        first: &str,
        when: Vec<Compare>,
        then: Vec<TxnOp>,
    ) -> Result<bool, MetaError> {
        let key = self.key(first);
        let err = self.request_error(&key);
        self.call(&key, move |mut c| async move {
            let resp = c
                .txn(Txn::new().when(when).and_then(then))
                .await
                .map_err(&err)?;
            Ok(resp.succeeded())
        })
    }

    /// etcd's current revision (a linearizable read of one key).
    pub(super) fn current_revision(&self) -> Result<i64, MetaError> {
        let key = self.key("cluster/id");
        let err = self.request_error(&key);
        let k = key.clone();
        self.call(&key, move |mut c| async move {
            let resp = c
                .get(k, Some(GetOptions::new().with_count_only()))
                .await
                .map_err(&err)?;
            Ok(resp.header().map_or(0, |h| h.revision()))
        })
    }

    /// The value and create revision of one key.
    pub(super) fn get_with_create_revision(
        &self,
        rest: &str,
    ) -> Result<Option<(Vec<u8>, i64)>, MetaError> {
        Ok(self.get_kv(rest)?.map(|kv| (kv.value, kv.create_revision)))
    }

    /// The create revision of a key (None: absent).
    pub(super) fn create_revision(&self, rest: &str) -> Result<Option<i64>, MetaError> {
        Ok(self.get_with_create_revision(rest)?.map(|(_, rev)| rev))
    }

    /// After a fenced transaction failed: Err(Fenced) if the fence is what
    /// failed.
    pub(super) fn check_fence(&self, term: CoordinatorTerm) -> Result<(), MetaError> {
        if self.create_revision("coordinator")? == Some(term.0) {
            Ok(())
        } else {
            Err(MetaError::Fenced(term.0))
        }
    }

    /// Puts every `(key, expected mod_revision, value)` atomically if every
    /// key is at its expected revision (0: absent).
    pub(super) fn txn_put(&self, puts: Vec<(String, i64, Vec<u8>)>) -> Result<bool, MetaError> {
        let first = puts.first().map(|p| p.0.clone()).unwrap_or_default();
        let (mut when, mut then) = (Vec::new(), Vec::new());
        for (rest, rev, value) in puts {
            let k = self.key(&rest);
            when.push(if rev == 0 {
                Compare::create_revision(k.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(k.clone(), CompareOp::Equal, rev)
            });
            then.push(TxnOp::put(k, value, None));
        }
        self.txn(&first, when, then)
    }

    pub(super) fn grant(&self, ttl: Duration) -> Result<i64, MetaError> {
        let err = self.request_error("lease");
        let secs = ttl.as_secs().max(1) as i64;
        self.call("lease", move |mut c| async move {
            Ok(c.lease_grant(secs, None).await.map_err(&err)?.id())
        })
    }

    /// One keep-alive of `lease`; false if it no longer exists.
    pub(super) fn keep_alive(&self, lease: i64) -> Result<bool, MetaError> {
        let err = self.request_error("lease keep-alive");
        self.call("lease keep-alive", move |mut c| async move {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease).await.map_err(&err)?;
            keeper.keep_alive().await.map_err(&err)?;
            match stream.message().await.map_err(&err)? {
                Some(resp) => Ok(resp.ttl() > 0),
                None => Ok(false),
            }
        })
    }

    pub(super) fn revoke(&self, lease: i64) {
        let err = self.request_error("lease revoke");
        let _ = self.call("lease revoke", move |mut c| async move {
            c.lease_revoke(lease).await.map_err(&err)?;
            Ok(())
        });
    }

    pub(super) fn put_with_lease(
        &self,
        rest: &str,
        value: Vec<u8>,
        lease: i64,
    ) -> Result<(), MetaError> {
        let key = self.key(rest);
        let err = self.request_error(&key);
        let k = key.clone();
        self.call(&key, move |mut c| async move {
            c.put(k, value, Some(PutOptions::new().with_lease(lease)))
                .await
                .map_err(&err)?;
            Ok(())
        })
    }

    /// Deletes `rest` (absent already is fine).
    pub(super) fn delete(&self, rest: &str) -> Result<(), MetaError> {
        let key = self.key(rest);
        let err = self.request_error(&key);
        let k = key.clone();
        self.call(&key, move |mut c| async move {
            c.delete(k, None).await.map_err(&err)?;
            Ok(())
        })
    }

    /// Creates `rest` bound to `lease` if absent; its create revision if it
    /// was created.
    pub(super) fn create_with_lease(
        &self,
        rest: &str,
        value: Vec<u8>,
        lease: i64,
    ) -> Result<Option<i64>, MetaError> {
        let key = self.key(rest);
        let err = self.request_error(&key);
        let k = key.clone();
        self.call(&key, move |mut c| async move {
            let txn = Txn::new()
                .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    k,
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            let resp = c.txn(txn).await.map_err(&err)?;
            Ok(resp
                .succeeded()
                .then(|| resp.header().map_or(0, |h| h.revision())))
        })
    }
}

/// One key as etcd holds it.
struct StoredKey {
    value: Vec<u8>,
    mod_revision: i64,
    create_revision: i64,
}

/// A listed key, its value and `mod_revision`.
pub(super) type Listed = (String, Vec<u8>, i64);

/// The keys of an etcd answer with their values and `mod_revision`s.
pub(super) fn listed(kvs: &[etcd_client::KeyValue]) -> Vec<Listed> {
    kvs.iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.value().to_vec(),
                kv.mod_revision(),
            )
        })
        .collect()
}
