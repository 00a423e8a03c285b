//! A small NVMe/TCP host (initiator) built on basalt-nvme-wire, talking to
//! a target over a real TCP socket: ICReq, Fabrics Connect, properties,
//! admin commands, and I/O with in-capsule data, R2T/H2CData and C2HData.
//! Shared by this crate's tests and the CLI's end-to-end test.

#![allow(dead_code)]

use basalt_frontend_nvme::subsystem_nqn;
use basalt_nvme_wire::command::{io_opcode, DsmRange};
use basalt_nvme_wire::decoder::max_plen_for_data;
use basalt_nvme_wire::fabrics::{Connect, PropertyGet, PropertySet, CNTLID_DYNAMIC, DISCOVERY_NQN};
use basalt_nvme_wire::pdu::Negotiated;
use basalt_nvme_wire::properties::{offset, Cc, Csts, PropertySize};
use basalt_nvme_wire::sqe::SglDescriptor;
use basalt_nvme_wire::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;
pub const BLOCK: u64 = 4096;
pub const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:test-host";
pub const OTHER_HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:intruder";
pub const HOST_ID: [u8; 16] = *b"basalt-test-host";

/// A PDU received by the host, owned.
#[derive(Debug, Clone)]
pub enum HostPdu {
    IcResp(IcResp),
    Resp(Cqe),
    C2H {
        cid: u16,
        offset: u32,
        last: bool,
        success: bool,
        data: Vec<u8>,
    },
    R2T(R2T),
    TermReq {
        fes: u16,
        fei: u32,
    },
}

/// The outcome of one command.
#[derive(Debug, Clone)]
pub struct Done {
    pub cqe: Cqe,
    pub data: Vec<u8>,
    /// C2HData PDUs received for it.
    pub c2h_pdus: usize,
    /// H2CData PDUs sent for it.
    pub h2c_pdus: usize,
    /// R2Ts received for it.
    pub r2ts: usize,
}

impl Done {
    pub fn status(&self) -> Status {
        self.cqe.status
    }
    pub fn ok(&self) -> &Self {
        assert!(
            self.cqe.status.is_success(),
            "command {} failed: {:?}",
            self.cqe.cid,
            self.cqe.status
        );
        self
    }
}

/// A command for [`Host::run`].
pub struct Cmd {
    pub sqe: Sqe,
    /// Data for the host to send (in-capsule or by H2CData).
    pub write: Vec<u8>,
    /// Send the data in the capsule.
    pub in_capsule: bool,
    /// Bytes to receive.
    pub read_len: u32,
}

/// A host queue (one TCP connection).
pub struct Host {
    pub stream: TcpStream,
    buf: Vec<u8>,
    pub negotiated: Negotiated,
    decoder: DecoderConfig,
    pub maxh2cdata: u32,
    pub qid: u16,
    pub cntlid: u16,
    next_cid: u16,
    pub sqhd_disabled: bool,
}

impl Host {
    /// Connects and exchanges ICReq/ICResp.
    pub fn connect(addr: SocketAddr, digests: Digests) -> Host {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let mut h = Host {
            stream,
            buf: Vec::new(),
            negotiated: Negotiated::INITIAL,
            decoder: DecoderConfig::host(max_plen_for_data(16 * MIB as u32)),
            maxh2cdata: 0,
            qid: 0,
            cntlid: 0,
            next_cid: 1,
            sqhd_disabled: false,
        };
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        h.stream.write_all(&out).unwrap();
        let resp = match h.recv() {
            HostPdu::IcResp(r) => r,
            other => panic!("expected ICResp, got {other:?}"),
        };
        assert_eq!(resp.digests, digests, "ICResp must echo the digests");
        assert_eq!(resp.cpda, 0);
        h.maxh2cdata = resp.maxh2cdata;
        h.negotiated = Negotiated::from_exchange(&req, &resp);
        h.decoder = h.decoder.with_negotiated(h.negotiated);
        h
    }

    pub fn cid(&mut self) -> u16 {
        let c = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        c
    }

    /// Sends raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Receives one PDU; panics on EOF.
    pub fn recv(&mut self) -> HostPdu {
        self.try_recv().expect("connection closed")
    }

    /// Receives one PDU, `None` on EOF or reset.
    pub fn try_recv(&mut self) -> Option<HostPdu> {
        loop {
            match decode_pdu(&self.buf, &self.decoder) {
                Ok(Decoded::Pdu { pdu, consumed }) => {
                    let owned = match pdu {
                        Pdu::IcResp(r) => HostPdu::IcResp(r),
                        Pdu::CapsuleResp(r) => HostPdu::Resp(r.cqe),
                        Pdu::C2HData(d) => HostPdu::C2H {
                            cid: d.cccid,
                            offset: d.datao,
                            last: d.last,
                            success: d.success,
                            data: d.data.to_vec(),
                        },
                        Pdu::R2T(r) => HostPdu::R2T(r),
                        Pdu::C2HTermReq(t) => HostPdu::TermReq {
                            fes: t.fes,
                            fei: t.fei,
                        },
                        other => panic!("unexpected PDU from the target: {other:?}"),
                    };
                    self.buf.drain(..consumed);
                    return Some(owned);
                }
                Ok(Decoded::NeedMore(_)) => {
                    let mut tmp = vec![0u8; 256 * 1024];
                    match self.stream.read(&mut tmp) {
                        Ok(0) | Err(_) => return None,
                        Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                    }
                }
                Err(e) => panic!("target sent a malformed PDU: {e}"),
            }
        }
    }

    fn send_capsule(&mut self, sqe: &Sqe, data: &[u8]) {
        let mut out = Vec::new();
        CapsuleCmd { sqe: *sqe, data }
            .encode(&self.negotiated, &mut out)
            .unwrap();
        self.send_raw(&out);
    }

    /// Sends every command, then serves R2Ts and collects data and
    /// completions until all are complete; results in the commands' order.
    pub fn run(&mut self, cmds: Vec<Cmd>) -> Vec<Done> {
        let mut state: HashMap<u16, (usize, Done)> = HashMap::new();
        let mut writes: HashMap<u16, Vec<u8>> = HashMap::new();
        for (i, mut c) in cmds.into_iter().enumerate() {
            let len = if c.in_capsule || c.write.is_empty() {
                c.write.len().max(c.read_len as usize) as u32
            } else {
                c.write.len() as u32
            };
            if c.sqe.sgl().length == 0 && len > 0 {
                c.sqe.set_sgl(&if c.in_capsule {
                    SglDescriptor::in_capsule(0, len)
                } else {
                    SglDescriptor::transport(len)
                });
            }
            let cid = c.sqe.cid;
            assert!(!state.contains_key(&cid), "duplicate cid {cid} in one run");
            state.insert(
                cid,
                (
                    i,
                    Done {
                        cqe: Cqe::default(),
                        data: vec![0; c.read_len as usize],
                        c2h_pdus: 0,
                        h2c_pdus: 0,
                        r2ts: 0,
                    },
                ),
            );
            if c.in_capsule {
                self.send_capsule(&c.sqe, &c.write);
            } else {
                self.send_capsule(&c.sqe, &[]);
                writes.insert(cid, c.write);
            }
        }
        let mut results: Vec<Option<Done>> = vec![None; state.len()];
        let mut left = state.len();
        while left > 0 {
            match self.recv() {
                HostPdu::R2T(r) => {
                    let (_, d) = state.get_mut(&r.cccid).expect("R2T for unknown cid");
                    d.r2ts += 1;
                    let data = &writes[&r.cccid];
                    let start = r.r2to as usize;
                    let end = start + r.r2tl as usize;
                    assert!(end <= data.len(), "R2T beyond the data");
                    let mut off = start;
                    let mut out = Vec::new();
                    while off < end {
                        let n = (end - off).min(self.maxh2cdata as usize);
                        H2CData {
                            cccid: r.cccid,
                            ttag: r.ttag,
                            datao: off as u32,
                            last: off + n == end,
                            data: &data[off..off + n],
                        }
                        .encode(&self.negotiated, &mut out)
                        .unwrap();
                        d.h2c_pdus += 1;
                        off += n;
                    }
                    self.send_raw(&out);
                }
                HostPdu::C2H {
                    cid,
                    offset,
                    last,
                    success,
                    data,
                } => {
                    let (i, d) = state.get_mut(&cid).expect("C2HData for unknown cid");
                    let off = offset as usize;
                    d.data[off..off + data.len()].copy_from_slice(&data);
                    d.c2h_pdus += 1;
                    if last && success {
                        d.cqe = Cqe::new(cid, self.qid, 0, Status::SUCCESS);
                        let i = *i;
                        results[i] = Some(state.remove(&cid).unwrap().1);
                        left -= 1;
                    }
                }
                HostPdu::Resp(cqe) => {
                    if !state.contains_key(&cqe.cid) {
                        panic!("completion for unknown cid {}: {cqe:?}", cqe.cid);
                    }
                    let (i, mut d) = state.remove(&cqe.cid).unwrap();
                    d.cqe = cqe;
                    results[i] = Some(d);
                    left -= 1;
                }
                other => panic!("unexpected PDU: {other:?}"),
            }
        }
        results.into_iter().map(|r| r.unwrap()).collect()
    }

    pub fn one(&mut self, cmd: Cmd) -> Done {
        self.run(vec![cmd]).pop().unwrap()
    }

    pub fn simple(&mut self, sqe: Sqe) -> Done {
        self.one(Cmd {
            sqe,
            write: Vec::new(),
            in_capsule: false,
            read_len: 0,
        })
    }

    /// Fabrics Connect; returns the completion.
    pub fn connect_queue(
        &mut self,
        qid: u16,
        sqsize: u16,
        kato: u32,
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
    ) -> Done {
        let c = Connect {
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato,
        };
        let cid = self.cid();
        let data = ConnectData {
            hostid: HOST_ID,
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .to_bytes()
        .unwrap();
        let done = self.one(Cmd {
            sqe: c.to_sqe(cid),
            write: data.to_vec(),
            in_capsule: true,
            read_len: 0,
        });
        if done.status().is_success() {
            self.qid = qid;
            self.cntlid = done.cqe.dw0 as u16;
        }
        done
    }

    pub fn prop_get(&mut self, off: u32, size: PropertySize) -> u64 {
        let cid = self.cid();
        let sqe = PropertyGet {
            attrib: size.attrib(),
            offset: off,
        }
        .to_sqe(cid);
        self.simple(sqe).ok().cqe.result()
    }

    pub fn prop_set(&mut self, off: u32, value: u64) {
        let cid = self.cid();
        let sqe = PropertySet {
            attrib: PropertySize::Four.attrib(),
            offset: off,
            value,
        }
        .to_sqe(cid);
        self.simple(sqe).ok();
    }

    /// Enables the controller as Linux does and waits for CSTS.RDY.
    pub fn enable(&mut self) {
        let cc = Cc {
            en: true,
            css: 0,
            mps: 0,
            iosqes: 6,
            iocqes: 4,
            ..Cc::default()
        };
        self.prop_set(offset::CC, u64::from(cc.to_u32()));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let csts = Csts::from_u32(self.prop_get(offset::CSTS, PropertySize::Four) as u32);
            if csts.rdy {
                break;
            }
            assert!(Instant::now() < deadline, "CSTS.RDY never set");
        }
    }

    pub fn identify(&mut self, cns_value: u8, nsid: u32) -> Done {
        let cid = self.cid();
        let mut sqe = Sqe::new(command::admin_opcode::IDENTIFY, cid);
        sqe.nsid = nsid;
        sqe.cdw10 = u32::from(cns_value);
        self.one(Cmd {
            sqe,
            write: Vec::new(),
            in_capsule: false,
            read_len: 4096,
        })
    }

    pub fn get_log(&mut self, lid: u8, nsid: u32, len: u32, offset: u64) -> Done {
        let cid = self.cid();
        let mut sqe = Sqe::new(command::admin_opcode::GET_LOG_PAGE, cid);
        sqe.nsid = nsid;
        let numd = len / 4 - 1;
        sqe.cdw10 = u32::from(lid) | ((numd & 0xffff) << 16);
        sqe.cdw11 = numd >> 16;
        sqe.cdw12 = offset as u32;
        sqe.cdw13 = (offset >> 32) as u32;
        self.one(Cmd {
            sqe,
            write: Vec::new(),
            in_capsule: false,
            read_len: len,
        })
    }

    pub fn set_features(&mut self, fid: u8, cdw11: u32) -> Done {
        let cid = self.cid();
        let mut sqe = Sqe::new(command::admin_opcode::SET_FEATURES, cid);
        sqe.cdw10 = u32::from(fid);
        sqe.cdw11 = cdw11;
        self.simple(sqe)
    }

    pub fn keep_alive(&mut self) -> Done {
        let cid = self.cid();
        self.simple(Sqe::new(command::admin_opcode::KEEP_ALIVE, cid))
    }

    /// The full admin sequence a Linux host performs; returns the host with
    /// its controller ID set.
    pub fn admin(addr: SocketAddr, digests: Digests, volume: &str, kato: u32) -> Host {
        let mut h = Host::connect(addr, digests);
        h.connect_queue(
            0,
            31,
            kato,
            CNTLID_DYNAMIC,
            &subsystem_nqn(volume),
            HOST_NQN,
        )
        .ok();
        assert_ne!(h.cntlid, 0);
        h.prop_get(offset::CAP, PropertySize::Eight);
        h.enable();
        h
    }

    /// A connected I/O queue of `admin`'s controller.
    pub fn io_queue(
        addr: SocketAddr,
        digests: Digests,
        admin: &Host,
        volume: &str,
        qid: u16,
    ) -> Host {
        let mut h = Host::connect(addr, digests);
        h.connect_queue(qid, 127, 0, admin.cntlid, &subsystem_nqn(volume), HOST_NQN)
            .ok();
        assert_eq!(h.cntlid, admin.cntlid);
        h
    }

    pub fn discovery(addr: SocketAddr, hostnqn: &str) -> Host {
        let mut h = Host::connect(addr, Digests::NONE);
        h.connect_queue(0, 31, 0, CNTLID_DYNAMIC, DISCOVERY_NQN, hostnqn)
            .ok();
        h.enable();
        h
    }

    // ---- I/O commands ----

    pub fn write_cmd(&mut self, slba: u64, data: Vec<u8>, fua: bool, in_capsule: bool) -> Cmd {
        let cid = self.cid();
        let mut sqe = Sqe::new(io_opcode::WRITE, cid);
        sqe.nsid = 1;
        sqe.cdw10 = slba as u32;
        sqe.cdw11 = (slba >> 32) as u32;
        let blocks = (data.len() as u64).div_ceil(BLOCK).max(1) as u32;
        sqe.cdw12 = (blocks - 1) | if fua { 1 << 30 } else { 0 };
        Cmd {
            sqe,
            write: data,
            in_capsule,
            read_len: 0,
        }
    }

    pub fn read_cmd(&mut self, slba: u64, blocks: u32) -> Cmd {
        let cid = self.cid();
        let mut sqe = Sqe::new(io_opcode::READ, cid);
        sqe.nsid = 1;
        sqe.cdw10 = slba as u32;
        sqe.cdw11 = (slba >> 32) as u32;
        sqe.cdw12 = blocks - 1;
        Cmd {
            sqe,
            write: Vec::new(),
            in_capsule: false,
            read_len: blocks * BLOCK as u32,
        }
    }

    pub fn write(&mut self, slba: u64, data: &[u8], fua: bool) -> Done {
        let in_capsule = data.len() <= 8192;
        let cmd = self.write_cmd(slba, data.to_vec(), fua, in_capsule);
        self.one(cmd)
    }

    pub fn read(&mut self, slba: u64, blocks: u32) -> Done {
        let cmd = self.read_cmd(slba, blocks);
        self.one(cmd)
    }

    pub fn flush(&mut self) -> Done {
        let cid = self.cid();
        let mut sqe = Sqe::new(io_opcode::FLUSH, cid);
        sqe.nsid = 1;
        self.simple(sqe)
    }

    pub fn write_zeroes(&mut self, slba: u64, blocks: u32, deallocate: bool) -> Done {
        let cid = self.cid();
        let mut sqe = Sqe::new(io_opcode::WRITE_ZEROES, cid);
        sqe.nsid = 1;
        sqe.cdw10 = slba as u32;
        sqe.cdw11 = (slba >> 32) as u32;
        sqe.cdw12 = (blocks - 1) | if deallocate { 1 << 25 } else { 0 };
        self.simple(sqe)
    }

    pub fn deallocate(&mut self, ranges: &[(u64, u32)]) -> Done {
        let cid = self.cid();
        let mut sqe = Sqe::new(io_opcode::DATASET_MANAGEMENT, cid);
        sqe.nsid = 1;
        sqe.cdw10 = ranges.len() as u32 - 1;
        sqe.cdw11 = 1 << 2;
        let mut data = Vec::new();
        for (slba, blocks) in ranges {
            data.extend_from_slice(
                &DsmRange {
                    attributes: 0,
                    blocks: *blocks,
                    slba: *slba,
                }
                .to_bytes(),
            );
        }
        self.one(Cmd {
            sqe,
            write: data,
            in_capsule: true,
            read_len: 0,
        })
    }

    /// Waits for the target to close the connection (EOF or reset),
    /// returning the PDUs received before.
    pub fn wait_closed(&mut self) -> Vec<HostPdu> {
        let mut got = Vec::new();
        while let Some(p) = self.try_recv() {
            got.push(p);
        }
        got
    }
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}
