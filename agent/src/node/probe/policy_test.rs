#![allow(clippy::unwrap_used)]

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn the_default_policy_refuses_each_class_and_allows_ordinary_addresses() {
    let policy = AddressPolicy::default();
    for (addr, class) in [
        ("169.254.169.254", Denied::CloudMetadata),
        ("fd00:ec2::254", Denied::CloudMetadata),
        ("100.100.100.200", Denied::CloudMetadata),
        ("127.0.0.1", Denied::Loopback),
        ("127.45.0.9", Denied::Loopback),
        ("::1", Denied::Loopback),
        ("::ffff:127.0.0.1", Denied::Loopback),
        ("::ffff:169.254.169.254", Denied::CloudMetadata),
        ("169.254.10.1", Denied::LinkLocal),
        ("fe80::1", Denied::LinkLocal),
        ("febf::1", Denied::LinkLocal),
        ("0.0.0.0", Denied::Unspecified),
        ("0.1.2.3", Denied::Unspecified),
        ("::", Denied::Unspecified),
        ("224.0.0.1", Denied::Multicast),
        ("ff02::1", Denied::Multicast),
        ("255.255.255.255", Denied::Broadcast),
    ] {
        assert_eq!(policy.check(ip(addr)), Err(class), "{addr}");
    }
    for addr in [
        "10.0.3.7",
        "192.168.1.1",
        "8.8.8.8",
        "fd00::1",
        "2001:db8::1",
        "fec0::1",
    ] {
        assert_eq!(policy.check(ip(addr)), Ok(()), "{addr}");
    }
}

#[test]
fn an_allowed_range_lets_its_addresses_through_and_nothing_else() {
    let policy = AddressPolicy::new(vec!["127.0.0.0/8".parse().unwrap()]);
    assert_eq!(policy.check(ip("127.0.0.1")), Ok(()));
    assert_eq!(policy.check(ip("::ffff:127.0.0.1")), Ok(()));
    assert_eq!(policy.check(ip("::1")), Err(Denied::Loopback));
    assert_eq!(policy.check(ip("169.254.1.1")), Err(Denied::LinkLocal));
}

#[test]
fn metadata_is_allowed_only_by_naming_it_exactly() {
    let wide = AddressPolicy::new(vec!["169.254.0.0/16".parse().unwrap()]);
    assert_eq!(wide.check(ip("169.254.1.1")), Ok(()));
    assert_eq!(
        wide.check(ip("169.254.169.254")),
        Err(Denied::CloudMetadata)
    );
    let exact = AddressPolicy::new(vec!["169.254.169.254".parse().unwrap()]);
    assert_eq!(exact.check(ip("169.254.169.254")), Ok(()));
    assert_eq!(
        AddressPolicy::allow_all().check(ip("fd00:ec2::254")),
        Ok(())
    );
    assert_eq!(AddressPolicy::allow_all().check(ip("127.0.0.1")), Ok(()));
}

#[test]
fn ranges_parse_print_back_and_refuse_nonsense() {
    for text in ["127.0.0.0/8", "10.0.0.1/32", "fe80::/10", "::1/128"] {
        assert_eq!(text.parse::<Cidr>().unwrap().to_string(), text);
    }
    assert_eq!(
        "10.0.0.1".parse::<Cidr>().unwrap().to_string(),
        "10.0.0.1/32"
    );
    for bad in ["10.0.0.1/33", "::1/129", "nope/8", "10.0.0.0/x", ""] {
        assert!(bad.parse::<Cidr>().is_err(), "{bad}");
    }
    let zero: Cidr = "0.0.0.0/0".parse().unwrap();
    assert!(zero.contains(ip("203.0.113.9")));
    assert!(!zero.contains(ip("2001:db8::1")));
}
