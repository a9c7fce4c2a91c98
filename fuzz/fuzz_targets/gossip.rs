//! Gossip datagrams: the AEAD envelope (`codec::open`, `codec::seal`) with a known region
//! keyring, and foca's decoder and state machine behind it (`Foca::handle_data` with the
//! agent's identity type and postcard codec), as the gossip driver runs them.
//!
//! Input: byte 0 picks the path.
//! - `0`: the rest is a datagram off the wire: it must never open (no valid seal can be
//!   forged), and nothing may panic.
//! - `1`: the rest drives a structured decoder that writes a foca packet with foca's own
//!   codec (a header from or to the identities in play, any message, member updates), so
//!   the packets reach foca's state machine rather than stopping at its decoder.
//! - otherwise: the rest is foca plaintext.
//!
//! Plaintext (from `1` or as given) is sealed with the ring's primary key, must open to
//! exactly itself, must stop opening when one byte is flipped, and is then handed to foca,
//! whose outputs and timers are drained.
#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;

use foca::{
    AccumulatingRuntime, Codec, Foca, Header, Member, Message, NoCustomBroadcast, PostcardCodec,
    State,
};
use libfuzzer_sys::fuzz_target;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use ring::rand::SystemRandom;
use waymark_agent::gossip::codec::{self, Key, Keyring};
use waymark_agent::gossip::{CLUSTER_SIZE_HINT, GossipId, Role};
use waymark_core::model::{NodeName, ZoneName};
use waymark_fuzz::Gen;

/// The identity the target's foca runs as; seeds address their datagrams to it.
pub fn local_identity() -> GossipId {
    identity("node-1", 7946, 1)
}

fn identity(name: &str, port: u16, bump: u64) -> GossipId {
    GossipId::with_bump(
        NodeName::try_new(name).expect("a valid node"),
        SocketAddr::from(([10, 0, 0, 1], port)),
        ZoneName::try_new("zone-a").expect("a valid zone"),
        Role::Agent,
        bump,
    )
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (sealing, opening) = keyrings();
    let mut scratch = Vec::new();
    if mode == 0 {
        assert!(
            codec::open(opening, rest, &mut scratch).is_err(),
            "a datagram nobody sealed opened"
        );
        return;
    }
    let structured;
    let rest = if mode == 1 {
        structured = packet(rest);
        structured.as_slice()
    } else {
        rest
    };
    if rest.is_empty()
        || rest.len()
            > foca::Config::new_lan(CLUSTER_SIZE_HINT)
                .max_packet_size
                .get()
    {
        return;
    }
    let mut sealed = Vec::new();
    codec::seal(sealing, &SystemRandom::new(), rest, &mut sealed).expect("sealing works");
    let opened = codec::open(opening, &sealed, &mut scratch).expect("our own seal opens");
    assert_eq!(opened, rest, "open(seal(x)) == x");
    let flip = usize::from(mode) % sealed.len();
    let mut tampered = sealed.clone();
    tampered[flip] ^= 0x01;
    assert!(
        codec::open(opening, &tampered, &mut Vec::new()).is_err(),
        "a tampered datagram opened (byte {flip})"
    );

    let mut foca: Foca<GossipId, PostcardCodec, SmallRng, NoCustomBroadcast> = Foca::new(
        local_identity(),
        foca::Config::new_lan(CLUSTER_SIZE_HINT),
        SmallRng::seed_from_u64(u64::from(mode)),
        PostcardCodec,
    );
    let mut runtime = AccumulatingRuntime::new();
    // Know one peer first, so membership updates and probes have someone to be about.
    let peer = Member::alive(identity("node-2", 7946, 1));
    let _ = foca.apply_many(std::iter::once(peer), false, &mut runtime);
    let _ = foca.handle_data(opened, &mut runtime);
    drain(&mut runtime);
    // A timer or two afterwards, as the driver would fire them.
    for _ in 0..4 {
        let Some((_, timer)) = runtime.to_schedule() else {
            break;
        };
        let _ = foca.handle_timer(timer, &mut runtime);
        drain(&mut runtime);
    }
});

/// A foca packet written with foca's codec: header, then (unless an announce) member
/// updates, then whatever bytes are left as a tail.
fn packet(data: &[u8]) -> Vec<u8> {
    let mut g = Gen::new(data);
    let pick_id = |g: &mut Gen<'_>| match g.below(5) {
        0 => identity("node-2", 7946, 1),
        1 => identity("node-3", 7947, g.u64()),
        2 => identity("node-1", 7946, 2),
        _ => local_identity(),
    };
    let src = if g.one_in(8) {
        local_identity()
    } else {
        pick_id(&mut g)
    };
    let dst = if g.one_in(6) {
        pick_id(&mut g)
    } else {
        local_identity()
    };
    let probe = g.byte();
    let message = match g.below(11) {
        0 => Message::Ping(probe),
        1 => Message::Ack(probe),
        2 => Message::PingReq {
            target: pick_id(&mut g),
            probe_number: probe,
        },
        3 => Message::IndirectPing {
            origin: pick_id(&mut g),
            probe_number: probe,
        },
        4 => Message::IndirectAck {
            target: pick_id(&mut g),
            probe_number: probe,
        },
        5 => Message::ForwardedAck {
            origin: pick_id(&mut g),
            probe_number: probe,
        },
        6 => Message::Announce,
        7 => Message::Feed,
        8 => Message::Broadcast,
        _ => Message::Gossip,
    };
    let header = Header {
        src,
        src_incarnation: u16::from(g.byte()),
        dst,
        message,
    };
    let mut buf = Vec::new();
    let mut codec = PostcardCodec;
    if codec.encode_header(&header, &mut buf).is_err() {
        return buf;
    }
    if header.message != Message::Announce && !g.one_in(4) {
        let n = g.below(6);
        buf.extend_from_slice(&(n as u16).to_be_bytes());
        for _ in 0..n {
            let state = [State::Alive, State::Suspect, State::Down][g.below(3)];
            let member = Member::new(pick_id(&mut g), u16::from(g.byte()), state);
            let _ = codec.encode_member(&member, &mut buf);
        }
    }
    buf.extend_from_slice(g.bytes(64));
    buf
}

fn drain(runtime: &mut AccumulatingRuntime<GossipId>) {
    while runtime.to_send().is_some() {}
    while runtime.to_notify().is_some() {}
}

/// A ring sealing with key B, and one holding keys A (primary) and B, as during rotation.
fn keyrings() -> &'static (Keyring, Keyring) {
    static RINGS: OnceLock<(Keyring, Keyring)> = OnceLock::new();
    RINGS.get_or_init(|| {
        let a = Key::from_bytes(&[0x11; codec::KEY_LEN]);
        let b = Key::from_bytes(&[0x22; codec::KEY_LEN]);
        (Keyring::single(b.clone()), Keyring::new(a, vec![b]))
    })
}
