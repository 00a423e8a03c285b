//! Property tests: every PDU decodes back to what was encoded under every
//! digest and alignment setting, a truncated PDU asks for more bytes,
//! corruption is caught by the digests, and arbitrary bytes never make the
//! decoder or the command and structure parsers panic or claim bytes they
//! were not given.

use basalt_nvme_wire::fabrics::{parse_fabrics, ConnectData};
use basalt_nvme_wire::log_page::{DiscoveryLog, DiscoveryLogEntry};
use basalt_nvme_wire::pdu::{MIN_MAXH2CDATA, TERM_REQ_MAX_ERROR_DATA};
use basalt_nvme_wire::properties::{Cap, Cc, Csts, Vs};
use basalt_nvme_wire::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn negotiated() -> impl Strategy<Value = Negotiated> {
    (any::<bool>(), any::<bool>(), 0u8..=31, 0u8..=31).prop_map(|(header, data, hpda, cpda)| {
        Negotiated {
            digests: Digests { header, data },
            hpda,
            cpda,
        }
    })
}

fn digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

fn sqe() -> impl Strategy<Value = Sqe> {
    vec(any::<u8>(), 64).prop_map(|b| Sqe::parse(&b).unwrap())
}

fn cqe() -> impl Strategy<Value = Cqe> {
    vec(any::<u8>(), 16).prop_map(|b| Cqe::parse(&b).unwrap())
}

/// An owned description of a PDU, borrowed as a [`Pdu`] for encoding.
#[derive(Debug, Clone)]
enum Owned {
    IcReq(IcReq),
    IcResp(IcResp),
    H2CTerm(u16, u32, Vec<u8>),
    C2HTerm(u16, u32, Vec<u8>),
    Cmd(Sqe, Vec<u8>),
    Resp(Cqe),
    H2C(u16, u16, u32, bool, Vec<u8>),
    C2H(u16, u32, bool, bool, Vec<u8>),
    R2T(R2T),
}

impl Owned {
    fn pdu(&self) -> Pdu<'_> {
        match self {
            Owned::IcReq(p) => Pdu::IcReq(*p),
            Owned::IcResp(p) => Pdu::IcResp(*p),
            Owned::H2CTerm(fes, fei, d) => Pdu::H2CTermReq(TermReq {
                fes: *fes,
                fei: *fei,
                error_data: d,
            }),
            Owned::C2HTerm(fes, fei, d) => Pdu::C2HTermReq(TermReq {
                fes: *fes,
                fei: *fei,
                error_data: d,
            }),
            Owned::Cmd(sqe, data) => Pdu::CapsuleCmd(CapsuleCmd { sqe: *sqe, data }),
            Owned::Resp(cqe) => Pdu::CapsuleResp(CapsuleResp { cqe: *cqe }),
            Owned::H2C(cccid, ttag, datao, last, data) => Pdu::H2CData(H2CData {
                cccid: *cccid,
                ttag: *ttag,
                datao: *datao,
                last: *last,
                data,
            }),
            Owned::C2H(cccid, datao, last, success, data) => Pdu::C2HData(C2HData {
                cccid: *cccid,
                datao: *datao,
                last: *last,
                success: *success && *last,
                data,
            }),
            Owned::R2T(p) => Pdu::R2T(*p),
        }
    }
}

fn data() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..600)
}

fn owned_pdu() -> impl Strategy<Value = Owned> {
    let term = || {
        (
            any::<u16>(),
            any::<u32>(),
            vec(any::<u8>(), 0..=TERM_REQ_MAX_ERROR_DATA),
        )
    };
    prop_oneof![
        (any::<u32>(), 0u8..=31, digests()).prop_map(|(maxr2t, hpda, digests)| Owned::IcReq(
            IcReq {
                pfv: 0,
                hpda,
                digests,
                maxr2t
            }
        )),
        (MIN_MAXH2CDATA / 4..=u32::MAX / 4, 0u8..=31, digests()).prop_map(
            |(dwords, cpda, digests)| Owned::IcResp(IcResp {
                pfv: 0,
                cpda,
                digests,
                maxh2cdata: dwords * 4
            })
        ),
        term().prop_map(|(f, i, d)| Owned::H2CTerm(f, i, d)),
        term().prop_map(|(f, i, d)| Owned::C2HTerm(f, i, d)),
        (sqe(), data()).prop_map(|(s, d)| Owned::Cmd(s, d)),
        cqe().prop_map(Owned::Resp),
        (
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            any::<bool>(),
            data()
        )
            .prop_map(|(c, t, o, l, d)| Owned::H2C(c, t, o, l, d)),
        (
            any::<u16>(),
            any::<u32>(),
            any::<bool>(),
            any::<bool>(),
            data()
        )
            .prop_map(|(c, o, l, s, d)| Owned::C2H(c, o, l, s, d)),
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>()).prop_map(
            |(cccid, ttag, r2to, r2tl)| Owned::R2T(R2T {
                cccid,
                ttag,
                r2to,
                r2tl
            })
        ),
    ]
}

/// The PDUs that carry a header digest (and maybe data with a digest).
fn digested_pdu() -> impl Strategy<Value = Owned> {
    owned_pdu().prop_filter("PDU type without digests", |o| {
        o.pdu().pdu_type().has_header_digest()
    })
}

fn config_for(pdu: &Pdu<'_>, negotiated: Negotiated) -> DecoderConfig {
    DecoderConfig {
        direction: pdu.pdu_type().direction(),
        negotiated,
        max_plen: u32::MAX,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn encode_decode_is_identity(owned in owned_pdu(), negotiated in negotiated()) {
        let pdu = owned.pdu();
        let mut out = vec![0xee; 3];
        pdu.encode(&negotiated, &mut out).unwrap();
        let bytes = &out[3..];
        let config = config_for(&pdu, negotiated);
        match decode_pdu(bytes, &config) {
            Ok(Decoded::Pdu { pdu: back, consumed }) => {
                prop_assert_eq!(back, pdu);
                prop_assert_eq!(consumed, bytes.len());
            }
            other => prop_assert!(false, "{:?}", other),
        }
        // Followed by more bytes, only the PDU is consumed.
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(&[0x04, 0, 72, 0]);
        match decode_pdu(&longer, &config) {
            Ok(Decoded::Pdu { consumed, .. }) => prop_assert_eq!(consumed, bytes.len()),
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn prefixes_ask_for_more(owned in owned_pdu(), negotiated in negotiated(), cut in any::<prop::sample::Index>()) {
        let pdu = owned.pdu();
        let mut out = Vec::new();
        pdu.encode(&negotiated, &mut out).unwrap();
        let cut = cut.index(out.len());
        match decode_pdu(&out[..cut], &config_for(&pdu, negotiated)) {
            Ok(Decoded::NeedMore(n)) => prop_assert!(n > 0 && cut + n <= out.len()),
            other => prop_assert!(false, "cut {}: {:?}", cut, other),
        }
    }

    #[test]
    fn digests_catch_any_flipped_bit(owned in digested_pdu(), hpda in 0u8..=31, cpda in 0u8..=31, at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let negotiated = Negotiated { digests: Digests::BOTH, hpda, cpda };
        let pdu = owned.pdu();
        let ty = pdu.pdu_type();
        let mut out = Vec::new();
        pdu.encode(&negotiated, &mut out).unwrap();
        let hlen = ty.header_len();
        let pdo = usize::from(pdu::CommonHeader::parse(&out).unwrap().pdo);
        // The bytes the digests cover: the header, and the data (the
        // padding between header digest and data is not covered).
        let mut covered: Vec<usize> = (0..hlen).collect();
        if pdo > 0 {
            covered.extend(pdo..out.len() - 4);
        }
        let at = covered[at.index(covered.len())];
        out[at] ^= 1 << bit;
        let config = config_for(&pdu, negotiated);
        match decode_pdu(&out, &config) {
            Err(PduError::HeaderDigest { .. }) => prop_assert!(at < hlen),
            Err(PduError::DataDigest { consumed, .. }) => {
                prop_assert!(at >= pdo);
                prop_assert_eq!(consumed, out.len());
            }
            // A flip in the common header may break it before the digest
            // is checked (type, HLEN, flags or lengths).
            Err(e) => prop_assert!(at < 8, "{:?} at {}", e, at),
            Ok(Decoded::NeedMore(_)) => prop_assert!(at < 8, "a corrupt PDU asked for more"),
            // A flipped type byte can turn the PDU into a termination
            // request, which carries no digest; nothing can notice that.
            Ok(Decoded::Pdu { pdu: other, .. }) => prop_assert!(
                at == 0 && other.pdu_type() != ty,
                "corruption at {} went unnoticed",
                at
            ),
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in vec(any::<u8>(), 0..400),
        negotiated in negotiated(),
        host in any::<bool>(),
        max_plen in any::<u32>(),
    ) {
        let config = DecoderConfig {
            direction: if host { Direction::ControllerToHost } else { Direction::HostToController },
            negotiated,
            max_plen,
        };
        match decode_pdu(&bytes, &config) {
            Ok(Decoded::Pdu { consumed, .. }) => {
                prop_assert!(consumed <= bytes.len());
                prop_assert!(consumed >= 8);
            }
            Ok(Decoded::NeedMore(n)) => prop_assert!(n > 0),
            Err(e) => {
                let _ = (e.fes(), e.fei(), e.to_string());
                prop_assert!(term_req_error_data(&bytes).len() <= 128);
            }
        }
    }

    #[test]
    fn arbitrary_pdu_shaped_bytes_never_panic(
        ty in prop::sample::select(vec![0u8, 1, 2, 3, 4, 5, 6, 7, 9]),
        flags in any::<u8>(),
        pdo in any::<u8>(),
        plen in 0u32..400,
        rest in vec(any::<u8>(), 0..400),
        negotiated in negotiated(),
        host in any::<bool>(),
    ) {
        // Valid type and HLEN, so the checks past the common header run.
        let hlen = PduType::from_code(ty).unwrap().header_len() as u8;
        let mut bytes = vec![ty, flags, hlen, pdo];
        bytes.extend_from_slice(&plen.to_le_bytes());
        bytes.extend_from_slice(&rest);
        let config = DecoderConfig {
            direction: if host { Direction::ControllerToHost } else { Direction::HostToController },
            negotiated,
            max_plen: 1 << 20,
        };
        if let Ok(Decoded::Pdu { consumed, pdu }) = decode_pdu(&bytes, &config) {
            prop_assert!(consumed <= bytes.len());
            // Whatever decodes re-encodes to a PDU that decodes the same.
            let mut again = Vec::new();
            if pdu.encode(&negotiated, &mut again).is_ok() {
                match decode_pdu(&again, &config) {
                    Ok(Decoded::Pdu { pdu: back, .. }) => prop_assert_eq!(back, pdu),
                    other => prop_assert!(false, "{:?}", other),
                }
            }
        }
    }

    #[test]
    fn sqe_and_commands(bytes in vec(any::<u8>(), 64), admin in any::<bool>(), data in vec(any::<u8>(), 0..2000)) {
        let sqe = Sqe::parse(&bytes).unwrap();
        prop_assert_eq!(&sqe.to_bytes()[..], &bytes[..]);
        let queue = if admin { QueueType::Admin } else { QueueType::Io };
        let _ = parse_command(&sqe, queue);
        let _ = parse_fabrics(&sqe);
        let sgl = sqe.sgl();
        prop_assert_eq!(SglDescriptor::from_bytes(&sgl.to_bytes()), sgl);
        if let Ok(d) = ConnectData::parse(&data) {
            prop_assert_eq!(ConnectData::parse(&d.to_bytes().unwrap()).unwrap(), d);
        }
        if let Ok(ranges) = command::parse_dsm_ranges(&data, (sqe.cdw10 & 0xff) as u16 + 1) {
            prop_assert!(ranges.count() * 16 <= data.len());
        }
        let _ = DiscoveryLog::parse(&data);
    }

    #[test]
    fn cqe_round_trip(bytes in vec(any::<u8>(), 16)) {
        let cqe = Cqe::parse(&bytes).unwrap();
        prop_assert_eq!(&cqe.to_bytes()[..], &bytes[..]);
    }

    #[test]
    fn connect_data_round_trip(
        hostid in any::<[u8; 16]>(),
        cntlid in any::<u16>(),
        subnqn in "[^\u{0}]{0,50}",
        hostnqn in "[a-z0-9.:-]{0,223}",
    ) {
        prop_assume!(subnqn.len() <= 223);
        let d = ConnectData { hostid, cntlid, subnqn, hostnqn };
        let bytes = d.to_bytes().unwrap();
        prop_assert_eq!(ConnectData::parse(&bytes).unwrap(), d);
    }

    #[test]
    fn discovery_log_round_trip(
        genctr in any::<u64>(),
        entries in vec(("[a-z0-9.:-]{1,64}", "[0-9.]{1,40}", "[0-9]{1,5}", any::<u16>(), any::<[u8; 4]>()), 0..4),
    ) {
        let log = DiscoveryLog {
            genctr,
            recfmt: 0,
            entries: entries
                .into_iter()
                .map(|(nqn, addr, port, portid, t)| DiscoveryLogEntry {
                    treq: t[0],
                    subtype: t[1],
                    eflags: u16::from(t[2]),
                    asqsz: u16::from(t[3]),
                    ..DiscoveryLogEntry::tcp(&nqn, &addr, &port, portid)
                })
                .collect(),
        };
        let mut out = Vec::new();
        log.encode(&mut out).unwrap();
        prop_assert_eq!(out.len(), 1024 * (1 + log.entries.len()));
        prop_assert_eq!(DiscoveryLog::parse(&out).unwrap(), log);
    }

    #[test]
    fn properties_round_trip(v in any::<u64>(), w in any::<u32>()) {
        let cap = Cap::from_u64(v);
        prop_assert_eq!(Cap::from_u64(cap.to_u64()), cap);
        let cc = Cc::from_u32(w);
        prop_assert_eq!(Cc::from_u32(cc.to_u32()), cc);
        let csts = Csts::from_u32(w);
        prop_assert_eq!(Csts::from_u32(csts.to_u32()), csts);
        prop_assert_eq!(Vs::from_u32(w).to_u32(), w);
    }
}
