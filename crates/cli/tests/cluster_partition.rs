//! Network partitions of a Basalt cluster, made with real Linux network
//! namespaces: every node runs in a namespace of its own on a private
//! bridge, etcd on the bridge itself and the test's clients in one more
//! namespace; cutting a node takes its bridge port down, so nothing reaches
//! it or leaves it while everything inside its namespace (its local
//! clients) keeps working (`common/netns.rs`).
//!
//! What this proves:
//! - `partitioned_secondary_resyncs_under_io`: while a secondary is cut off
//!   under a pattern writer (FUA writes, trims, periodic flushes) and fio
//!   with `verify=crc32c`, the primaries mark it out of sync and keep
//!   acknowledging flushed writes; once the link is back it resyncs under
//!   I/O, every flushed write verifies through every node, the replicas are
//!   identical and no volume is left degraded.
//! - `partitioned_primary_is_fenced`: a cut-off primary (first one that is
//!   not the coordinator, then the coordinator itself) acknowledges none of
//!   the writes its local client keeps sending, and serves no stale read once
//!   the majority side has elected a new primary (epoch + 1) and written new
//!   data through it; after the heal the old primary steps down, resyncs
//!   and returns the new data, writes its client sent are applied only
//!   through the new primary, the replicas are identical and no volume is
//!   left degraded.
//!
//! Needs root (network namespaces) and the tools `scripts/test.sh` installs.

mod common;

use common::cluster::*;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// How long a progress condition of a writer may take.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(30);

/// A crash_writer.py run with `--progress`: counts the flushes it reports.
struct PatternWriter {
    bg: Background,
    flushes: u64,
}

impl PatternWriter {
    fn note(&mut self, line: &str) {
        if let Some(n) = line
            .strip_prefix("PROGRESS flushes=")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
        {
            self.flushes = self.flushes.max(n);
        }
    }

    /// Waits until `more` flushes beyond those reported so far completed.
    #[track_caller]
    fn wait_flushes(&mut self, more: u64, what: &str, c: &Cluster) {
        while let Some(l) = self.bg.next_line(Duration::ZERO) {
            self.note(&l);
        }
        let target = self.flushes + more;
        let deadline = Instant::now() + PROGRESS_TIMEOUT;
        while self.flushes < target {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.bg.next_line(left) {
                Some(l) => self.note(&l),
                None => panic!(
                    "the pattern writer completed {} of {target} flushes {what} within \
                     {PROGRESS_TIMEOUT:?}; its output:\n{}\n{}",
                    self.flushes,
                    self.bg.seen.join("\n"),
                    c.logs()
                ),
            }
        }
        eprintln!("pattern writer: {} flushes ({what})", self.flushes);
    }
}

/// The last line of a script's stdout, as JSON.
#[track_caller]
fn last_json_line(out: &str, what: &str) -> Value {
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{what}: last output line is not JSON ({e}):\n{out}"))
}

#[test]
fn partitioned_secondary_resyncs_under_io() {
    // Checked before the cluster starts.
    require_tool("fio");
    let seed = test_seed("partitioned_secondary_resyncs_under_io");
    let c = Cluster::start_in_netns(3);
    let client = c.client_netns();
    // One volume for the pattern writer, one for fio.
    let (pw, fv) = ("pw", "fv");
    for vol in [pw, fv] {
        c.nodes[0]
            .cli(&["volume", "create", vol, "--size", "32M", "--replicas", "3"])
            .ok();
    }
    let primaries: Vec<usize> = [pw, fv]
        .iter()
        .map(|vol| {
            let v = c.wait_volume(0, vol, "placed and in sync", healthy);
            node_index(&primary(&v).expect("a primary"))
        })
        .collect();
    let coordinator = c.coordinator(0);
    // Cut a node that is a secondary of both volumes, preferably not the
    // coordinator (if it is, I/O also waits for a new coordinator).
    let cut = (0..3)
        .filter(|i| !primaries.contains(i))
        .min_by_key(|i| Some(*i) == coordinator)
        .expect("two volumes leave a node that is primary of neither");
    eprintln!(
        "primaries: {pw} node{}, {fv} node{}; coordinator {coordinator:?}; cutting node{cut}",
        primaries[0], primaries[1]
    );

    let scratch = Scratch::new();
    let cmd = fio_verify(
        client,
        &scratch.0,
        "partition",
        &c.nodes[primaries[1]].uri(fv),
        4,
        15,
    );
    let fio = Background::spawn(cmd);

    let state = scratch.path("state.json");
    let py_seed = (seed % 1_000_000).to_string();
    let mut cmd = python_cmd("crash_writer.py");
    in_netns(&mut cmd, client);
    cmd.arg(c.nodes[primaries[0]].uri(pw))
        .arg(&state)
        .arg(&py_seed)
        .args(["--max-seconds", "120", "--fua-rate", "0.2"])
        .args(["--stop-on-stdin", "--progress"]);
    let mut writer = PatternWriter {
        bg: Background::spawn(cmd),
        flushes: 0,
    };
    writer.bg.wait_line("READY", Duration::from_secs(60));
    writer.wait_flushes(3, "before the partition", &c);

    let cut_at = Instant::now();
    c.net().cut(cut);
    for (vol, p) in [pw, fv].into_iter().zip(&primaries) {
        c.wait_volume(*p, vol, &format!("with node{cut} out of sync"), |v| {
            replica_state(v, cut).is_some_and(|s| s != "in-sync")
        });
    }
    eprintln!("node{cut} marked out of sync after {:?}", cut_at.elapsed());
    writer.wait_flushes(5, &format!("while node{cut} is cut off"), &c);
    // The partition lasts at least this long whatever the machine's speed
    // (it is the experiment, not a wait for something).
    let min_cut = Duration::from_secs(5);
    if let Some(rest) = min_cut.checked_sub(cut_at.elapsed()) {
        std::thread::sleep(rest);
    }
    c.net().heal(cut);
    let healed_at = Instant::now();
    writer.wait_flushes(3, "after the heal", &c);
    for vol in [pw, fv] {
        // Through the node that was cut off: it sees the cluster again.
        c.wait_volume(cut, vol, "in sync again after the heal", healthy);
    }
    eprintln!(
        "partition lasted {:?}; resynced {:?} after the heal",
        healed_at - cut_at,
        healed_at.elapsed()
    );

    let (st, out, err) = writer.bg.finish(Duration::from_secs(60));
    assert!(
        st.success(),
        "pattern writer failed:\n{out}\n{err}\n{}",
        c.logs()
    );
    let summary = last_json_line(&out, "pattern writer");
    assert!(
        summary["lost"].is_null(),
        "the writer's connection to the primary broke: {summary}"
    );
    eprintln!("pattern writer: {summary}");
    let (st, out, err) = fio.finish(Duration::from_secs(120));
    assert!(
        st.success(),
        "fio failed ({st:?}):\n{err}\n{out}\n{}",
        c.logs()
    );
    // fio's nbd engine prints a line of its own before the JSON.
    let json: Value = serde_json::from_str(&out[out.find('{').unwrap_or(0)..])
        .unwrap_or_else(|e| panic!("fio output is not JSON ({e}):\n{out}\n{err}"));
    let job = &json["jobs"][0];
    assert_eq!(job["error"].as_u64(), Some(0), "fio job error: {job}");
    let ios = job["write"]["total_ios"].as_u64().unwrap_or(0);
    assert!(ios > 1000, "fio wrote almost nothing: {job}");
    eprintln!("fio: {ios} verified writes");

    // Every flushed write reads back through every node.
    for i in 0..3 {
        let mut cmd = python_cmd("crash_writer.py");
        in_netns(&mut cmd, client);
        cmd.arg(c.nodes[i].uri(pw))
            .arg(&state)
            .arg(&py_seed)
            .arg("--verify-only");
        let out = run_cmd(&mut cmd, Duration::from_secs(180));
        assert_eq!(
            out.code(),
            Some(0),
            "verification through node{i} failed:\n{}\n{}",
            out.describe(),
            c.logs()
        );
    }
    for vol in [pw, fv] {
        c.assert_replicas_equal(&[0, 1, 2], vol);
        let v = c.show(cut, vol);
        assert!(healthy(&v), "{vol} is degraded: {v:#}");
    }
}

/// Blocks of the range the majority side rewrites (and the fenced client
/// reads), and of the range the fenced client writes.
const WATCHED: (u64, u64) = (0, 256);
const FENCED: (u64, u64) = (2048, 512);
/// How long the fenced client keeps reading after the new data was written
/// (an observation window, not a wait for a condition).
const STALE_READ_WINDOW: Duration = Duration::from_secs(2);

/// Cuts off node `old`, the primary of `vol`, while a client in its own
/// namespace writes and reads through it; checks fencing, failover, the
/// heal and the data (see the module docs).
fn fence_round(c: &Cluster, vol: &str, old: usize, seed: u64, round: u64) {
    let client = c.client_netns();
    let others: Vec<usize> = (0..c.nodes.len()).filter(|i| *i != old).collect();
    let via = others[0];
    let was_coordinator = c.coordinator(via) == Some(old);
    let before = c.show(via, vol);
    let e0 = epoch(&before);
    let (gen_old, gen_new, gen_fenced) = (10 * round + 1, 10 * round + 2, 10 * round + 3);
    let bytes = |(first, n): (u64, u64)| (first * 4096, n * 4096);
    let (w_off, w_len) = bytes(WATCHED);
    eprintln!(
        "round {round}: cutting node{old}, primary of {vol} (epoch {e0}){}",
        if was_coordinator {
            " and the coordinator"
        } else {
            ""
        }
    );
    write_pattern(client, &c.nodes[via].uri(vol), seed, gen_old, w_off, w_len);

    let mut cmd = python_cmd("fenced_client.py");
    in_netns(&mut cmd, c.nodes[old].netns());
    let arg = |x: u64| x.to_string();
    cmd.arg(c.nodes[old].uri(vol)).args([
        "--seed",
        &arg(seed),
        "--gen",
        &arg(gen_fenced),
        "--write-offset",
        &arg(bytes(FENCED).0),
        "--write-blocks",
        &arg(FENCED.1),
        "--read-offset",
        &arg(w_off),
        "--read-blocks",
        &arg(WATCHED.1),
    ]);
    let mut fenced = Background::spawn(cmd);
    fenced.wait_line("READY", Duration::from_secs(60));

    let resyncs_before = c.failover_resyncs_of(via, vol);
    let cut_at = Instant::now();
    c.net().cut(old);
    fenced.send_line("GO");
    let v = c.wait_volume(via, vol, "failed over to the majority side", |v| {
        epoch(v) > e0 && primary(v).is_some_and(|p| node_index(&p) != old)
    });
    let new_primary = node_index(&primary(&v).expect("a primary"));
    eprintln!(
        "round {round}: node{new_primary} primary in epoch {} after {:?}",
        epoch(&v),
        cut_at.elapsed()
    );
    if was_coordinator {
        let now = c.coordinator(via);
        assert!(
            now.is_some_and(|n| n != old),
            "the failover happened, yet the coordinator is {now:?}"
        );
    }
    // New data from the majority side, through the node that is not the
    // new primary (forwarded), read back through the other one.
    let writer = *others.iter().find(|i| **i != new_primary).expect("a node");
    write_pattern(
        client,
        &c.nodes[writer].uri(vol),
        seed,
        gen_new,
        w_off,
        w_len,
    );
    let new_written = monotonic_secs();
    verify_pattern(
        client,
        &c.nodes[new_primary].uri(vol),
        seed,
        gen_new,
        w_off,
        w_len,
    );
    std::thread::sleep(STALE_READ_WINDOW);

    let heal = monotonic_secs();
    c.net().heal(old);
    let healed_at = Instant::now();
    fenced.send_line("STOP");
    let (st, out, err) = fenced.finish(Duration::from_secs(120));
    assert!(
        st.success(),
        "the fenced client failed:\n{out}\n{err}\n{}",
        c.logs()
    );
    let report = last_json_line(&out, "fenced client");
    check_fenced_client(&report, heal, new_written, gen_old, gen_new, gen_fenced, c);
    eprintln!(
        "round {round}: the fenced client's commands drained {:?} after the heal",
        healed_at.elapsed()
    );

    let v = c.wait_volume(old, vol, "in sync, the old primary a secondary", |v| {
        healthy(v) && primary(v).is_some_and(|p| node_index(&p) != old)
    });
    assert!(epoch(&v) > e0, "{v:#}");
    eprintln!(
        "round {round}: node{old} resynced {:?} after the heal",
        healed_at.elapsed()
    );
    // Neither the deposed primary nor the other secondary was copied in
    // full: both reported their log of the old epoch to the new primary.
    let (narrowed, full) = c.failover_resyncs_of(via, vol);
    assert!(
        narrowed >= resyncs_before.0 + 2 && full == resyncs_before.1,
        "failover resyncs (narrowed, full) went from {resyncs_before:?} to {:?}\n{}",
        (narrowed, full),
        c.logs()
    );
    // Through the old primary, from its own namespace: the new data.
    verify_pattern(
        c.nodes[old].netns(),
        &c.nodes[old].uri(vol),
        seed,
        gen_new,
        w_off,
        w_len,
    );
}

/// Judges fenced_client.py's record (see the script): no write was
/// acknowledged before the heal, no read after the new data was written
/// returned the old data, and every acknowledged write is on the volume.
#[allow(clippy::too_many_arguments)]
fn check_fenced_client(
    report: &Value,
    heal: f64,
    new_written: f64,
    gen_old: u64,
    gen_new: u64,
    gen_fenced: u64,
    c: &Cluster,
) {
    let ops = report["ops"].as_array().expect("fenced client ops");
    let fail = |what: &str, op: &Value| -> ! {
        panic!(
            "{what}: {op}\n(heal at {heal:.3}, new data written by {new_written:.3})\n{}",
            c.logs()
        )
    };
    let (mut writes, mut acked, mut failed, mut old_reads, mut new_reads) = (0, 0, 0, 0, 0);
    let mut acked_blocks = std::collections::BTreeSet::new();
    for op in ops {
        let ok = op["ok"].as_bool();
        let done = op["done"].as_f64();
        let block = op["block"].as_u64().expect("block");
        match op["kind"].as_str() {
            Some("write") => {
                writes += 1;
                match (ok, done) {
                    (Some(true), Some(t)) if t < heal => {
                        fail("the partitioned primary acknowledged a write", op)
                    }
                    (Some(true), _) => {
                        acked += 1;
                        acked_blocks.insert(block);
                    }
                    (Some(false), _) => failed += 1,
                    _ => fail("a write was never answered", op),
                }
            }
            Some("read") if ok == Some(true) => {
                let gen = op["gen"].as_u64();
                if gen == Some(gen_old) {
                    if done.is_some_and(|t| t > new_written) {
                        fail("stale read: old data after the new data was written", op);
                    }
                    old_reads += 1;
                } else if gen == Some(gen_new) {
                    new_reads += 1;
                } else {
                    fail("a read returned neither the old nor the new data", op);
                }
            }
            Some("read") => {}
            _ => fail("unknown op", op),
        }
    }
    let before_heal = ops
        .iter()
        .filter(|op| op["kind"] == "write" && op["issued"].as_f64().is_some_and(|t| t < heal))
        .count();
    assert!(
        before_heal >= 10,
        "the fenced client sent only {before_heal} writes during the partition: {report}"
    );
    // Each block was written once: an acknowledged write must be there; an
    // unacknowledged one may or may not have landed.
    let final_gens = report["final"].as_array().expect("final contents");
    for (i, g) in final_gens.iter().enumerate() {
        let block = FENCED.0 + i as u64;
        let g = g.as_u64();
        let ok = if acked_blocks.contains(&block) {
            g == Some(gen_fenced)
        } else {
            g == Some(0) || g == Some(gen_fenced)
        };
        assert!(
            ok,
            "block {block} of the fenced range holds gen {g:?} (acknowledged: {})",
            acked_blocks.contains(&block)
        );
    }
    eprintln!(
        "fenced client: {writes} writes ({before_heal} sent while cut off): none acknowledged \
         before the heal, {acked} after it (through the new primary), {failed} failed; reads: \
         {old_reads} old data before the failover, {new_reads} new data"
    );
}

#[test]
fn partitioned_primary_is_fenced() {
    let seed = test_seed("partitioned_primary_is_fenced") % 1_000_000;
    let c = Cluster::start_in_netns(3);
    // Three volumes: placement gives every node one primary, so both a
    // primary that is not the coordinator and the coordinator's can be cut.
    let vols = ["f0", "f1", "f2"];
    for vol in vols {
        c.create_rf3(vol, "16M");
    }
    let primary_of =
        |vol: &str, via: usize| node_index(&primary(&c.show(via, vol)).expect("a primary"));
    let coordinator = c.coordinator(0).expect("a coordinator");
    let (vol, old) = vols
        .iter()
        .map(|v| (*v, primary_of(v, 0)))
        .find(|(_, p)| *p != coordinator)
        .expect("a volume whose primary is not the coordinator");
    fence_round(&c, vol, old, seed, 1);
    for v in vols {
        c.wait_volume(coordinator, v, "healthy after round 1", healthy);
    }

    let coordinator = c.coordinator(0).expect("a coordinator");
    let (vol, old) = vols
        .iter()
        .map(|v| (*v, primary_of(v, 0)))
        .find(|(_, p)| *p == coordinator)
        .expect("the coordinator is the primary of a volume");
    fence_round(&c, vol, old, seed, 2);
    for v in vols {
        c.wait_volume(old, v, "healthy after round 2", healthy);
        c.assert_replicas_equal(&[0, 1, 2], v);
    }
}
