//! The DNS server's Prometheus metrics (`waymark_dns_*`).

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::message::Transport;

/// `transport`, `qtype` and `rcode`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct QueryLabels {
    /// `udp` or `tcp`.
    pub(super) transport: &'static str,
    /// `a`, `aaaa`, `srv`, `soa`, `any` or `other` (bounded on purpose).
    pub(super) qtype: &'static str,
    /// `noerror`, `nxdomain`, `refused`, `notimp`, `badvers`, `servfail` or `other`.
    pub(super) rcode: &'static str,
}

/// `transport`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct TransportLabels {
    /// `udp` or `tcp`.
    pub(super) transport: &'static str,
}

/// Every metric the DNS server reports. Clones share the same series.
#[derive(Debug, Clone, Default)]
pub(super) struct DnsMetrics {
    /// Queries answered, by transport, question type and response code.
    pub(super) queries: Family<QueryLabels, Counter>,
    /// Messages that were not a well-formed single-question query.
    pub(super) malformed: Family<TransportLabels, Counter>,
    /// UDP answers sent empty with TC set because they did not fit.
    pub(super) truncated: Counter,
    /// TCP connections closed at once because the connection limit was reached.
    pub(super) tcp_rejected: Counter,
}

impl DnsMetrics {
    /// Register everything under `waymark_`.
    pub(super) fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("waymark");
        r.register(
            "dns_queries",
            "DNS queries answered, by transport, question type and response code",
            self.queries.clone(),
        );
        r.register(
            "dns_malformed",
            "DNS messages that were not a well-formed single-question query (dropped, or answered FORMERR)",
            self.malformed.clone(),
        );
        r.register(
            "dns_truncated",
            "DNS answers too large for the UDP buffer, sent empty with TC set",
            self.truncated.clone(),
        );
        r.register(
            "dns_tcp_rejected",
            "DNS TCP connections closed at once because the connection limit was reached",
            self.tcp_rejected.clone(),
        );
    }

    pub(super) fn count_query(
        &self,
        transport: Transport,
        qtype: RecordType,
        rcode: ResponseCode,
        truncated: bool,
    ) {
        let labels = QueryLabels {
            transport: transport.as_str(),
            qtype: qtype_label(qtype),
            rcode: rcode_label(rcode),
        };
        self.queries.get_or_create(&labels).inc();
        if truncated {
            self.truncated.inc();
        }
    }

    pub(super) fn count_malformed(&self, transport: Transport) {
        let labels = TransportLabels {
            transport: transport.as_str(),
        };
        self.malformed.get_or_create(&labels).inc();
    }
}

fn qtype_label(qtype: RecordType) -> &'static str {
    match qtype {
        RecordType::A => "a",
        RecordType::AAAA => "aaaa",
        RecordType::SRV => "srv",
        RecordType::SOA => "soa",
        RecordType::ANY => "any",
        _ => "other",
    }
}

fn rcode_label(rcode: ResponseCode) -> &'static str {
    match rcode {
        ResponseCode::NoError => "noerror",
        ResponseCode::NXDomain => "nxdomain",
        ResponseCode::Refused => "refused",
        ResponseCode::NotImp => "notimp",
        ResponseCode::BADVERS => "badvers",
        ResponseCode::ServFail => "servfail",
        _ => "other",
    }
}
