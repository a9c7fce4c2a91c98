//! The outlier detection every served cluster carries, with every field set explicitly.
//!
//! Envoy reads an unset field as its documented default; other xDS clients need not.
//! `@grpc/grpc-js-xds` 1.14 crashed on the clusters we served when they set only
//! `max_ejection_percent` (read in the sources tagged `@grpc/grpc-js-xds@1.14.0` and
//! `@grpc/grpc-js@1.14.3`, and the same in the 1.14.1 / 1.14.7 packages the tests pin):
//!
//! - `convertOutlierDetectionUpdate` (grpc-js-xds `src/xds-resource-type/cluster-resource-type.ts`)
//!   enables success-rate ejection unless `enforcing_success_rate` is 0, copying
//!   `success_rate_minimum_hosts` and `success_rate_request_volume` (and the rest) as
//!   `field?.value`, which is `undefined` when the field is unset;
//! - `OutlierDetectionLoadBalancingConfig`'s constructor (grpc-js
//!   `src/load-balancer-outlier-detection.ts`) spreads that object over its defaults, and an
//!   own property holding `undefined` replaces a default;
//! - at the first interval (10 s) `runSuccessRateCheck` compares each host's volume with an
//!   `undefined` `request_volume` (never reached, so no success rates) and `0 < undefined`
//!   (false, so it does not return early), then calls `successRates.reduce(...)` on the
//!   empty array with no initial value: a `TypeError` thrown from a timer, which ends the
//!   process.
//!
//! With every field set the spread replaces nothing with `undefined`, and
//! [`SUCCESS_RATE_MINIMUM_HOSTS`] ≥ 1 makes that check return before the `reduce` whenever
//! no host has the volume. The values are Envoy's documented defaults, so an Envoy reads
//! the clusters exactly as before; the one value of our own is still
//! [`EJECTION_PERCENT_MAX`], the client-side ejection cap.

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::OutlierDetection;
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};

use super::{EJECTION_PERCENT_MAX, pb_duration};

/// Consecutive server errors (5xx, or connection failures) before a host is ejected.
/// Envoy's default; grpc ignores it (gRPC's outlier detection has no consecutive mode).
pub const CONSECUTIVE_5XX: u32 = 5;
/// How often hosts are judged (and ejected ones considered for return). Envoy's default,
/// and grpc-js's own when unset.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// How long a host is ejected the first time; each later ejection multiplies it, up to
/// [`MAX_EJECTION_TIME`]. Envoy's default.
pub const BASE_EJECTION_TIME: Duration = Duration::from_secs(30);
/// The longest ejection. Envoy's default (it applies 300 s when unset).
pub const MAX_EJECTION_TIME: Duration = Duration::from_secs(300);
/// Random time added to an ejection so ejected hosts do not all return at once. Envoy's
/// default (none).
pub const MAX_EJECTION_TIME_JITTER: Duration = Duration::ZERO;
/// Chance, in percent, that a consecutive-5xx outlier is actually ejected. Envoy's default.
pub const ENFORCING_CONSECUTIVE_5XX_PERCENT: u32 = 100;
/// Chance, in percent, that a success-rate outlier is actually ejected. Envoy's default.
/// Not 0: that would switch success-rate ejection off in grpc clients (they read 0 as
/// "disabled") while Envoy sidecars keep it, and callers would judge hosts differently.
pub const ENFORCING_SUCCESS_RATE_PERCENT: u32 = 100;
/// Hosts that must each reach [`SUCCESS_RATE_REQUEST_VOLUME`] in an interval before
/// success-rate ejection judges anyone. Envoy's default. Must stay at least 1: grpc-js
/// 1.14 guards its mean over the qualifying hosts only with `qualifying < minimum_hosts`,
/// so 0 would bring back the `reduce` of an empty array (see the module doc).
pub const SUCCESS_RATE_MINIMUM_HOSTS: u32 = 5;
/// Requests a host must have had in an interval to be judged by success rate. Envoy's
/// default.
pub const SUCCESS_RATE_REQUEST_VOLUME: u32 = 100;
/// A host is a success-rate outlier below mean − stdev × this / 1000. Envoy's default (1.9).
pub const SUCCESS_RATE_STDEV_FACTOR_PERMILLE: u32 = 1_900;
/// Consecutive gateway failures (502, 503, 504) before an ejection. Envoy's default.
pub const CONSECUTIVE_GATEWAY_FAILURE: u32 = 5;
/// Chance, in percent, that a gateway-failure outlier is actually ejected. Envoy's default
/// (off): 502, 503 and 504 are 5xx, so [`CONSECUTIVE_5XX`] already ejects on them.
pub const ENFORCING_CONSECUTIVE_GATEWAY_FAILURE_PERCENT: u32 = 0;
/// Whether locally originated failures (timeouts, resets) are counted apart from the
/// host's own errors. Envoy's default (no); the three local-origin values below only apply
/// when it is on.
pub const SPLIT_EXTERNAL_LOCAL_ORIGIN_ERRORS: bool = false;
/// Consecutive locally originated failures before an ejection. Envoy's default.
pub const CONSECUTIVE_LOCAL_ORIGIN_FAILURE: u32 = 5;
/// Chance, in percent, that a local-origin consecutive outlier is ejected. Envoy's default.
pub const ENFORCING_CONSECUTIVE_LOCAL_ORIGIN_FAILURE_PERCENT: u32 = 100;
/// Chance, in percent, that a local-origin success-rate outlier is ejected. Envoy's default.
pub const ENFORCING_LOCAL_ORIGIN_SUCCESS_RATE_PERCENT: u32 = 100;
/// Failure percentage at or above which a host is a failure-percentage outlier. Envoy's
/// default.
pub const FAILURE_PERCENTAGE_THRESHOLD: u32 = 85;
/// Chance, in percent, that a failure-percentage outlier is ejected. Envoy's default (off),
/// which grpc clients also read as "failure-percentage ejection disabled".
pub const ENFORCING_FAILURE_PERCENTAGE_PERCENT: u32 = 0;
/// The same for local-origin failure percentages. Envoy's default (off).
pub const ENFORCING_FAILURE_PERCENTAGE_LOCAL_ORIGIN_PERCENT: u32 = 0;
/// Hosts a cluster must have before failure-percentage ejection judges anyone. Envoy's
/// default.
pub const FAILURE_PERCENTAGE_MINIMUM_HOSTS: u32 = 5;
/// Requests a host must have had in an interval to be judged by failure percentage.
/// Envoy's default.
pub const FAILURE_PERCENTAGE_REQUEST_VOLUME: u32 = 50;
/// Whether a passing active health check returns an ejected host. Envoy's default; our
/// clusters configure no active health checks, so it changes nothing today.
pub const SUCCESSFUL_ACTIVE_HEALTH_CHECK_UNEJECT_HOST: bool = true;
/// Whether one host may be ejected even where [`EJECTION_PERCENT_MAX`] of the cluster is
/// less than one host. Envoy's default (no): the cap is the cap.
pub const ALWAYS_EJECT_ONE_HOST: bool = false;
/// Whether hosts answering `x-envoy-degraded` are marked degraded. Envoy's default (no):
/// waymark says which hosts are degraded, in the view.
pub const DETECT_DEGRADED_HOSTS: bool = false;

/// The outlier detection of every cluster we serve: each field the constant above it names.
/// There is no `..Default::default()` on purpose: a field a newer `envoy-types` adds does
/// not compile here until someone has chosen its value.
pub fn detection() -> OutlierDetection {
    let count = |value| Some(UInt32Value { value });
    let flag = |value| Some(BoolValue { value });
    OutlierDetection {
        consecutive_5xx: count(CONSECUTIVE_5XX),
        interval: Some(pb_duration(INTERVAL)),
        base_ejection_time: Some(pb_duration(BASE_EJECTION_TIME)),
        max_ejection_percent: count(EJECTION_PERCENT_MAX),
        enforcing_consecutive_5xx: count(ENFORCING_CONSECUTIVE_5XX_PERCENT),
        enforcing_success_rate: count(ENFORCING_SUCCESS_RATE_PERCENT),
        success_rate_minimum_hosts: count(SUCCESS_RATE_MINIMUM_HOSTS),
        success_rate_request_volume: count(SUCCESS_RATE_REQUEST_VOLUME),
        success_rate_stdev_factor: count(SUCCESS_RATE_STDEV_FACTOR_PERMILLE),
        consecutive_gateway_failure: count(CONSECUTIVE_GATEWAY_FAILURE),
        enforcing_consecutive_gateway_failure: count(ENFORCING_CONSECUTIVE_GATEWAY_FAILURE_PERCENT),
        split_external_local_origin_errors: SPLIT_EXTERNAL_LOCAL_ORIGIN_ERRORS,
        consecutive_local_origin_failure: count(CONSECUTIVE_LOCAL_ORIGIN_FAILURE),
        enforcing_consecutive_local_origin_failure: count(
            ENFORCING_CONSECUTIVE_LOCAL_ORIGIN_FAILURE_PERCENT,
        ),
        enforcing_local_origin_success_rate: count(ENFORCING_LOCAL_ORIGIN_SUCCESS_RATE_PERCENT),
        failure_percentage_threshold: count(FAILURE_PERCENTAGE_THRESHOLD),
        enforcing_failure_percentage: count(ENFORCING_FAILURE_PERCENTAGE_PERCENT),
        enforcing_failure_percentage_local_origin: count(
            ENFORCING_FAILURE_PERCENTAGE_LOCAL_ORIGIN_PERCENT,
        ),
        failure_percentage_minimum_hosts: count(FAILURE_PERCENTAGE_MINIMUM_HOSTS),
        failure_percentage_request_volume: count(FAILURE_PERCENTAGE_REQUEST_VOLUME),
        max_ejection_time: Some(pb_duration(MAX_EJECTION_TIME)),
        max_ejection_time_jitter: Some(pb_duration(MAX_EJECTION_TIME_JITTER)),
        successful_active_health_check_uneject_host: flag(
            SUCCESSFUL_ACTIVE_HEALTH_CHECK_UNEJECT_HOST,
        ),
        // Not implemented in Envoy (hidden in its API): no monitors.
        monitors: Vec::new(),
        always_eject_one_host: flag(ALWAYS_EJECT_ONE_HOST),
        detect_degraded_hosts: flag(DETECT_DEGRADED_HOSTS),
    }
}
