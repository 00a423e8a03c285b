//! Mirrors of etcd key prefixes, kept current by one etcd watch stream
//! with revision resume.
//!
//! A watch lists its prefixes once (paged, pinned at one revision), then
//! follows etcd's watch from the next revision: idle, it costs etcd nothing
//! but the open stream, whatever the number of keys. When the stream breaks
//! (etcd restarted, a network cut), it resumes from the last revision it
//! applied; only when that revision was compacted away does it list again,
//! and then tells its owner exactly the keys that changed, appeared or
//! disappeared meanwhile. A stream that goes silent is probed with a
//! progress request and replaced if etcd does not answer.
//!
//! Invariants:
//! - [`Mirror`] holds, for every key, the newest value seen and its
//!   `mod_revision`; it never goes back to an older value (a change at or
//!   below the stored `mod_revision` is ignored), so a resumed stream that
//!   repeats events changes nothing;
//! - the owner's callback sees every change, in revision order, after the
//!   mirror applied it, on the watch's own thread (never on the runtime, so
//!   it may call etcd);
//! - the first list completes before [`watch_prefixes`] returns, so the
//!   owner starts from a full view;
//! - a watch's [`Progress`] reaches a revision only once the owner's
//!   callback has seen every change up to it, so a reader that waits for
//!   etcd's current revision then reads the owner's copy as etcd had it.

use super::core::{listed, Core, Listed};
use super::{MetaError, WatchGuard};
use basalt_catalog::prefix_end;
use etcd_client::{EventType, GetOptions, SortOrder, SortTarget, WatchOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One key's change, as the mirror applied it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Put {
        key: String,
        value: Vec<u8>,
        mod_revision: i64,
    },
    Delete {
        key: String,
    },
}

impl Change {
    pub(crate) fn key(&self) -> &str {
        match self {
            Change::Put { key, .. } | Change::Delete { key } => key,
        }
    }
}

/// The keys under some prefixes, each followed up to a revision; see the
/// module docs.
#[derive(Debug)]
pub(crate) struct Mirror {
    prefixes: Vec<String>,
    keys: BTreeMap<String, (Vec<u8>, i64)>,
    /// Per prefix: the revision up to which every change under it is
    /// applied (a stream's watches progress separately).
    revisions: Vec<i64>,
}

impl Mirror {
    pub(crate) fn new(prefixes: Vec<String>) -> Mirror {
        let revisions = vec![0; prefixes.len()];
        Mirror {
            prefixes,
            keys: BTreeMap::new(),
            revisions,
        }
    }

    /// The revision up to which every change under prefix `i` is applied.
    pub(crate) fn revision(&self, i: usize) -> i64 {
        self.revisions.get(i).copied().unwrap_or(0)
    }

    /// A key's value and `mod_revision`.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &str) -> Option<(&[u8], i64)> {
        self.keys.get(key).map(|(v, r)| (v.as_slice(), *r))
    }

    /// Every key under `prefix`, in key order, with its value and
    /// `mod_revision`.
    pub(crate) fn under<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a [u8], i64)> + 'a {
        self.keys
            .range(prefix.to_string()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, (v, r))| (k.as_str(), v.as_slice(), *r))
    }

    /// Replaces the contents with a full list of every prefix taken at
    /// `revision`; the changes that makes (puts of new or changed keys,
    /// deletes of keys not listed).
    pub(crate) fn reset(
        &mut self,
        list: Vec<(String, Vec<u8>, i64)>,
        revision: i64,
    ) -> Vec<Change> {
        let listed: BTreeMap<String, (Vec<u8>, i64)> =
            list.into_iter().map(|(k, v, r)| (k, (v, r))).collect();
        let mut changes: Vec<Change> = self
            .keys
            .keys()
            .filter(|k| !listed.contains_key(*k))
            .map(|k| Change::Delete { key: k.clone() })
            .collect();
        for (k, (v, r)) in &listed {
            if self.keys.get(k).is_none_or(|(_, old)| old != r) {
                changes.push(Change::Put {
                    key: k.clone(),
                    value: v.clone(),
                    mod_revision: *r,
                });
            }
        }
        self.keys = listed;
        self.revisions.iter_mut().for_each(|r| *r = revision);
        changes
    }

    /// Applies one watched change that happened at `revision`; the change
    /// if it changed the mirror. A change at or below what its prefix was
    /// followed to, or older than the key's stored value, is ignored.
    pub(crate) fn apply(&mut self, change: Change, revision: i64) -> Option<Change> {
        let i = self
            .prefixes
            .iter()
            .position(|p| change.key().starts_with(p.as_str()))?;
        if revision <= self.revisions[i] {
            return None;
        }
        let stored = self.keys.get(change.key()).map(|(_, r)| *r);
        match &change {
            Change::Put {
                key,
                value,
                mod_revision,
            } => {
                if stored.is_some_and(|r| r >= *mod_revision) {
                    return None;
                }
                self.keys
                    .insert(key.clone(), (value.clone(), *mod_revision));
            }
            Change::Delete { key } => {
                if stored.is_none_or(|r| r >= revision) {
                    return None;
                }
                self.keys.remove(key);
            }
        }
        Some(change)
    }

    /// Every change under prefix `i` up to `revision` has been applied.
    pub(crate) fn advance(&mut self, i: usize, revision: i64) {
        if let Some(r) = self.revisions.get_mut(i) {
            *r = (*r).max(revision);
        }
    }

    /// Every change under every prefix up to `revision` has been applied.
    pub(crate) fn advance_all(&mut self, revision: i64) {
        for i in 0..self.revisions.len() {
            self.advance(i, revision);
        }
    }

    /// The revision up to which every change under every prefix is
    /// applied.
    pub(crate) fn applied(&self) -> i64 {
        self.revisions.iter().copied().min().unwrap_or(0)
    }
}

/// How far a watch has brought its owner: every change up to `revision`
/// has been applied to the mirror and handed to the owner's callback. A
/// reader that needs the owner's copy as current as a revision it read
/// from etcd waits for it ([`Progress::wait_for`]), which asks etcd for a
/// progress notification so that a quiet prefix answers at once.
pub(crate) struct Progress {
    revision: parking_lot::Mutex<i64>,
    changed: parking_lot::Condvar,
    ask: tokio::sync::Notify,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            revision: parking_lot::Mutex::new(0),
            changed: parking_lot::Condvar::new(),
            ask: tokio::sync::Notify::new(),
        }
    }

    fn set(&self, revision: i64) {
        let mut r = self.revision.lock();
        if revision > *r {
            *r = revision;
            self.changed.notify_all();
        }
    }

    /// Waits until every change up to `revision` reached the owner;
    /// whether it did within `timeout`.
    pub(crate) fn wait_for(&self, revision: i64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut r = self.revision.lock();
        while *r < revision {
            self.ask.notify_one();
            if self.changed.wait_until(&mut r, deadline).timed_out() {
                return *r >= revision;
            }
        }
        true
    }
}

/// What a watch's owner is told: the mirror, and the changes just applied.
pub(crate) type OnChange = Box<dyn FnMut(&Mirror, &[Change]) + Send>;

/// Keys per page of a list.
const LIST_PAGE: i64 = 1000;
/// The largest answer the watch client decodes: a page or a watch response
/// of many records, well past gRPC's default 4 MiB.
const MAX_MESSAGE: usize = 64 << 20;
/// Silence on a stream after which it is probed, and again after which it
/// is replaced: a stream stalled by a network cut (its TCP connection in
/// retransmission backoff after the cut heals) is replaced within twice
/// this, so a node's view is never stale for longer after a partition.
/// A quiet healthy stream answers the probe at once (one small request per
/// interval).
const PROBE_AFTER: Duration = Duration::from_secs(2);
/// Wait before retrying after a failure to list or to open a stream.
const RETRY: Duration = Duration::from_millis(250);

/// Every key under the `prefixes` (full keys), in pages pinned at one
/// revision; with that revision.
fn list(core: &Core, prefixes: &[String]) -> Result<(Vec<Listed>, i64), MetaError> {
    let mut out = Vec::new();
    let mut revision = 0;
    for prefix in prefixes {
        let end = prefix_end(prefix.as_bytes());
        let mut from = prefix.as_bytes().to_vec();
        loop {
            let err = core.request_error(prefix);
            let (range_from, range_end) = (from.clone(), end.clone());
            let (page, more, rev): (Vec<Listed>, bool, i64) =
                core.call(prefix, move |c| async move {
                    let mut opts = GetOptions::new()
                        .with_range(range_end)
                        .with_limit(LIST_PAGE)
                        .with_sort(SortTarget::Key, SortOrder::Ascend);
                    if revision > 0 {
                        opts = opts.with_revision(revision);
                    }
                    let resp = c
                        .kv_client()
                        .max_decoding_message_size(MAX_MESSAGE)
                        .get(range_from, Some(opts))
                        .await
                        .map_err(&err)?;
                    let rev = resp.header().map_or(0, |h| h.revision());
                    Ok((listed(resp.kvs()), resp.more(), rev))
                })?;
            if revision == 0 {
                revision = rev;
            }
            let last = page.last().map(|(k, _, _)| k.clone());
            out.extend(page);
            match (more, last) {
                (true, Some(last)) => {
                    from = last.into_bytes();
                    from.push(0);
                }
                _ => break,
            }
        }
    }
    Ok((out, revision))
}

/// Why a stream ended.
enum StreamEnd {
    Stopped,
    /// Broken or silent: resume from the mirror's revisions.
    Resume,
    /// A revision to resume from was compacted: list again.
    Relist,
}

/// How long opening a stream may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// Follows every prefix of `mirror` from its revision + 1 on one stream
/// (one watch per prefix, watch id = index + 1) until the stream ends;
/// applied changes go to `on_change`.
fn follow(
    core: &Core,
    mirror: &mut Mirror,
    on_change: &mut dyn FnMut(&Mirror, &[Change]),
    progress: &Progress,
    stop: &AtomicBool,
) -> StreamEnd {
    let watches: Vec<(String, i64)> = mirror
        .prefixes
        .iter()
        .enumerate()
        .map(|(i, p)| (p.clone(), mirror.revision(i) + 1))
        .collect();
    let client = core.client.clone();
    let open = core.handle.block_on(async move {
        let opts = |i: usize, p: &str, start: i64| {
            WatchOptions::new()
                .with_range(prefix_end(p.as_bytes()))
                .with_start_revision(start)
                .with_progress_notify()
                .with_watch_id(i as i64 + 1)
        };
        let mut watch = client.watch_client().max_decoding_message_size(MAX_MESSAGE);
        tokio::time::timeout(OPEN_TIMEOUT, async {
            let (p0, s0) = &watches[0];
            let mut stream = watch.watch(p0.clone(), Some(opts(0, p0, *s0))).await?;
            for (i, (p, start)) in watches.iter().enumerate().skip(1) {
                stream.watch(p.clone(), Some(opts(i, p, *start))).await?;
            }
            Ok::<_, etcd_client::Error>(stream)
        })
        .await
    });
    let mut stream = match open {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot open an etcd watch stream; retrying");
            return StreamEnd::Resume;
        }
        Err(_) => return StreamEnd::Resume,
    };
    let mut last_heard = Instant::now();
    let mut probed = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            return StreamEnd::Stopped;
        }
        let msg = core.handle.block_on(async {
            tokio::select! {
                m = stream.message() => Ok(m),
                _ = progress.ask.notified() => {
                    // A reader waits for this watch: etcd answers a
                    // progress request with the revision every watch of
                    // the stream has sent everything up to.
                    let _ = stream.request_progress().await;
                    Err(true)
                }
                _ = tokio::time::sleep(Duration::from_millis(200)) => Err(false),
            }
        });
        let resp = match msg {
            Err(true) => continue,
            Err(false) => {
                if last_heard.elapsed() >= PROBE_AFTER * 2 {
                    tracing::debug!("etcd watch stream silent; reopening it");
                    return StreamEnd::Resume;
                }
                if !probed && last_heard.elapsed() >= PROBE_AFTER {
                    probed = true;
                    let _ = core
                        .handle
                        .block_on(async { stream.request_progress().await });
                }
                continue;
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "etcd watch stream broke; resuming");
                return StreamEnd::Resume;
            }
            Ok(Ok(None)) => return StreamEnd::Resume,
            Ok(Ok(Some(resp))) => resp,
        };
        last_heard = Instant::now();
        probed = false;
        if resp.compact_revision() > 0 {
            tracing::info!(
                compacted = resp.compact_revision(),
                "etcd compacted past a watch's revision; listing again"
            );
            return StreamEnd::Relist;
        }
        if resp.canceled() {
            return StreamEnd::Resume;
        }
        let header = resp.header().map_or(0, |h| h.revision());
        if resp.watch_id() < 0 {
            // The answer to a progress request: every watch of the stream
            // has sent everything up to the header's revision.
            mirror.advance_all(header);
            progress.set(mirror.applied());
            continue;
        }
        let i = (resp.watch_id() - 1) as usize;
        if resp.created() {
            continue;
        }
        let mut applied = Vec::new();
        let mut upto = 0;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let change = match ev.event_type() {
                EventType::Put => Change::Put {
                    key,
                    value: kv.value().to_vec(),
                    mod_revision: kv.mod_revision(),
                },
                EventType::Delete => Change::Delete { key },
            };
            // Events of one response may share a revision (a transaction):
            // the prefix's revision advances past them only afterwards.
            if let Some(c) = mirror.apply(change, kv.mod_revision()) {
                applied.push(c);
            }
            upto = upto.max(kv.mod_revision());
        }
        // Events, or a progress notification: this watch has sent
        // everything up to here.
        mirror.advance(
            i,
            if resp.events().is_empty() {
                header
            } else {
                upto
            },
        );
        if !applied.is_empty() {
            on_change(mirror, &applied);
        }
        progress.set(mirror.applied());
    }
}

/// Mirrors the keys under `prefixes` (relative to the cluster's prefix):
/// lists them now (Err if etcd cannot be read), calls `on_change` with the
/// mirror and the first list's keys, then follows etcd's watch on a thread
/// of its own until the guard is dropped; see the module docs.
pub(crate) fn watch_prefixes(
    core: Arc<Core>,
    name: &str,
    prefixes: &[&str],
    mut on_change: OnChange,
) -> Result<WatchGuard, MetaError> {
    let prefixes: Vec<String> = prefixes.iter().map(|p| core.key(p)).collect();
    let mut mirror = Mirror::new(prefixes.clone());
    let (first, revision) = list(&core, &prefixes)?;
    let changes = mirror.reset(first, revision);
    on_change(&mirror, &changes);
    let progress = Arc::new(Progress::new());
    progress.set(mirror.applied());
    let p = progress.clone();
    let mut guard = super::spawn_loop(name, move |stop| {
        let mut relist = false;
        while !stop.load(Ordering::SeqCst) {
            if relist {
                match list(&core, &prefixes) {
                    Ok((keys, revision)) => {
                        let changes = mirror.reset(keys, revision);
                        if !changes.is_empty() {
                            on_change(&mirror, &changes);
                        }
                        p.set(mirror.applied());
                        relist = false;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "listing watched keys failed; retrying");
                        if !super::nap(stop, RETRY) {
                            return;
                        }
                        continue;
                    }
                }
            }
            match follow(&core, &mut mirror, &mut *on_change, &p, stop) {
                StreamEnd::Stopped => return,
                StreamEnd::Relist => relist = true,
                StreamEnd::Resume => {
                    if !super::nap(stop, RETRY) {
                        return;
                    }
                }
            }
        }
    })?;
    guard.progress = Some(progress);
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str, rev: i64) -> Change {
        Change::Put {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            mod_revision: rev,
        }
    }

    #[test]
    fn a_list_after_a_compaction_reports_exactly_what_changed() {
        let mut m = Mirror::new(vec![String::new()]);
        let first = m.reset(
            vec![
                ("a".into(), b"1".to_vec(), 2),
                ("b".into(), b"1".to_vec(), 3),
                ("c".into(), b"1".to_vec(), 4),
            ],
            4,
        );
        assert_eq!(first.len(), 3);
        let second = m.reset(
            vec![
                ("a".into(), b"1".to_vec(), 2),
                ("c".into(), b"2".to_vec(), 9),
                ("d".into(), b"1".to_vec(), 8),
            ],
            10,
        );
        assert_eq!(
            second,
            vec![
                Change::Delete { key: "b".into() },
                put("c", "2", 9),
                put("d", "1", 8),
            ]
        );
        assert_eq!(m.revision(0), 10);
        assert_eq!(m.get("c"), Some((&b"2"[..], 9)));
    }

    #[test]
    fn replayed_or_older_events_change_nothing() {
        let mut m = Mirror::new(vec![String::new()]);
        m.reset(vec![("a".into(), b"1".to_vec(), 5)], 5);
        assert_eq!(m.apply(put("a", "0", 4), 4), None);
        assert_eq!(m.apply(put("a", "1", 5), 5), None);
        assert_eq!(m.apply(put("a", "2", 6), 6), Some(put("a", "2", 6)));
        // Not yet advanced: the same event again is still no change.
        assert_eq!(m.apply(put("a", "2", 6), 6), None);
        m.advance(0, 6);
        assert_eq!(m.apply(put("a", "3", 6), 6), None);
        assert_eq!(
            m.apply(Change::Delete { key: "a".into() }, 7),
            Some(Change::Delete { key: "a".into() })
        );
        assert_eq!(m.apply(Change::Delete { key: "a".into() }, 8), None);
        assert_eq!(m.get("a"), None);
    }

    #[test]
    fn prefixes_are_listed_by_key_range() {
        let mut m = Mirror::new(vec!["/p/a/".into(), "/p/ab".into()]);
        m.reset(
            vec![
                ("/p/a/1".into(), vec![], 1),
                ("/p/a/2".into(), vec![], 2),
                ("/p/ab".into(), vec![], 3),
            ],
            3,
        );
        let keys: Vec<&str> = m.under("/p/a/").map(|(k, _, _)| k).collect();
        assert_eq!(keys, ["/p/a/1", "/p/a/2"]);
        // A change outside every prefix is not the mirror's.
        assert_eq!(m.apply(put("/p/b", "1", 9), 9), None);
    }

    /// Against a real etcd: a watch that missed changes past a compaction
    /// is told to list again, and the list reports exactly what changed;
    /// one that resumes finds what happened while it was away.
    #[test]
    fn a_compacted_watch_lists_again_and_a_broken_one_resumes() {
        let etcd = basalt_etcd_fixture::EtcdServer::start().unwrap();
        let meta = super::super::ClusterMeta::connect(
            super::super::EtcdConfig::new([etcd.endpoint()]).with_prefix("/tw/"),
        )
        .unwrap();
        let core = meta.core.clone();
        let put = |k: &str, v: &str| {
            let (c, k, v) = (core.client.clone(), core.key(k), v.to_string());
            core.handle
                .block_on(async move {
                    c.clone()
                        .put(k, v, None)
                        .await
                        .map(|r| r.header().map_or(0, |h| h.revision()))
                })
                .unwrap()
        };
        put("w/a", "1");
        put("w/b", "1");
        let prefixes = vec![core.key("w/")];
        let (keys, rev) = list(&core, &prefixes).unwrap();
        let mut mirror = Mirror::new(prefixes.clone());
        assert_eq!(mirror.reset(keys, rev).len(), 2);

        // Changes while the mirror is away, then a compaction past them.
        put("w/b", "2");
        let last = put("w/c", "1");
        let (c, k) = (core.client.clone(), core.key("w/a"));
        core.handle
            .block_on(async move { c.clone().delete(k, None).await })
            .unwrap();
        let c = core.client.clone();
        core.handle
            .block_on(async move { c.clone().compact(last, None).await })
            .unwrap();
        let stop = AtomicBool::new(false);
        let mut seen = Vec::new();
        let progress = Progress::new();
        let end = follow(
            &core,
            &mut mirror,
            &mut |_, ch| seen.extend_from_slice(ch),
            &progress,
            &stop,
        );
        assert!(matches!(end, StreamEnd::Relist));
        assert!(seen.is_empty());
        let (keys, rev) = list(&core, &prefixes).unwrap();
        let changes = mirror.reset(keys, rev);
        let described: Vec<(bool, &str)> = changes
            .iter()
            .map(|c| (matches!(c, Change::Put { .. }), c.key()))
            .collect();
        let (a, b, c) = (core.key("w/a"), core.key("w/b"), core.key("w/c"));
        assert_eq!(
            described,
            vec![(false, a.as_str()), (true, b.as_str()), (true, c.as_str())]
        );

        // Resumed from its revision (not compacted): every change since,
        // in order, and nothing older again.
        put("w/d", "1");
        put("w/b", "3");
        let stopper = std::sync::Arc::new(AtomicBool::new(false));
        let s2 = stopper.clone();
        let mut seen: Vec<Change> = Vec::new();
        let end = follow(
            &core,
            &mut mirror,
            &mut |_, ch| {
                seen.extend_from_slice(ch);
                if seen.len() >= 2 {
                    s2.store(true, Ordering::SeqCst);
                }
            },
            &progress,
            &stopper,
        );
        assert!(matches!(end, StreamEnd::Stopped));
        let keys: Vec<&str> = seen.iter().map(Change::key).collect();
        assert_eq!(keys, vec![core.key("w/d"), core.key("w/b")]);
    }
}
