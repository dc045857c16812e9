//! Envoy's access log of the public listeners: to stdout, by default one JSON object a
//! line with the fields operators look for, sampled when asked. The probe listeners log
//! nothing (only the prober reaches them).

use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, RuntimeFilter, access_log, access_log_filter,
};
use envoy_types::pb::envoy::config::core::v3::SubstitutionFormatString;
use envoy_types::pb::envoy::extensions::access_loggers::stream::v3::StdoutAccessLog;
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent};
use envoy_types::pb::google::protobuf::{Struct, Value, value};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};

use super::proto;
use crate::model::{self, AccessLogFormat};

pub const STDOUT_LOGGER: &str = "envoy.access_loggers.stdout";
/// The runtime key that could override the sampling (Envoy's runtime, unset by us).
pub const SAMPLE_RUNTIME_KEY: &str = "switchyard.access_log.sample_percent";

/// The JSON fields and the Envoy command of each, in the order they are encoded.
pub const JSON_FIELDS: &[(&str, &str)] = &[
    ("authority", "%REQ(:AUTHORITY)%"),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("duration_ms", "%DURATION%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("route_name", "%ROUTE_NAME%"),
    ("start_time", "%START_TIME%"),
    ("status", "%RESPONSE_CODE%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    (
        "upstream_service_time_ms",
        "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    ),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
];

/// The JSON fields of a connection forwarded whole (TCP or TLS), in the order they are
/// encoded.
pub const CONNECTION_JSON_FIELDS: &[(&str, &str)] = &[
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("duration_ms", "%DURATION%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("start_time", "%START_TIME%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
];

/// The field numbers of `log_format` in StdoutAccessLog and of `json_format` in
/// SubstitutionFormatString.
const LOG_FORMAT_FIELD: u32 = 1;
const JSON_FORMAT_FIELD: u32 = 2;

/// The access logs of a public listener's connection manager (none when off).
pub fn access_logs(settings: &model::AccessLog) -> Vec<AccessLog> {
    logs_of(settings, JSON_FIELDS)
}

/// The access logs of a connection forwarded whole (none when off): one line a
/// connection, when it closes.
pub fn connection_access_logs(settings: &model::AccessLog) -> Vec<AccessLog> {
    logs_of(settings, CONNECTION_JSON_FIELDS)
}

fn logs_of(settings: &model::AccessLog, json_fields: &[(&str, &str)]) -> Vec<AccessLog> {
    let logger = match settings.format {
        AccessLogFormat::Off => return Vec::new(),
        AccessLogFormat::Text => StdoutAccessLog::default().encode_to_vec(),
        AccessLogFormat::Json => json_stdout_logger(json_fields),
    };
    let filter = (settings.sample_percent < 100).then(|| AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::RuntimeFilter(
            RuntimeFilter {
                runtime_key: SAMPLE_RUNTIME_KEY.to_owned(),
                percent_sampled: Some(FractionalPercent {
                    numerator: settings.sample_percent,
                    denominator: fractional_percent::DenominatorType::Hundred as i32,
                }),
                // Each request on its own, not by its x-request-id.
                use_independent_randomness: true,
            },
        )),
    });
    vec![AccessLog {
        name: STDOUT_LOGGER.to_owned(),
        filter,
        config_type: Some(access_log::ConfigType::TypedConfig(proto::pack_bytes::<
            StdoutAccessLog,
        >(logger))),
    }]
}

/// StdoutAccessLog { log_format: { json_format: `json_fields` } }, encoded by hand so
/// that the bytes do not depend on the order of a `HashMap` (Struct's fields): the same
/// configuration, the same version (I6).
fn json_stdout_logger(json_fields: &[(&str, &str)]) -> Vec<u8> {
    let mut fields = Struct::default();
    for (name, command) in json_fields {
        fields.fields.insert(
            (*name).to_owned(),
            Value {
                kind: Some(value::Kind::StringValue((*command).to_owned())),
            },
        );
    }
    let json = proto::encode_with_sorted_map(fields, |s| &mut s.fields);
    let mut format = SubstitutionFormatString::default().encode_to_vec();
    length_delimited(&mut format, JSON_FORMAT_FIELD, &json);
    let mut logger = StdoutAccessLog::default().encode_to_vec();
    length_delimited(&mut logger, LOG_FORMAT_FIELD, &format);
    logger
}

fn length_delimited(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::access_loggers::stream::v3::stdout_access_log;

    use super::*;

    fn decoded(logs: &[AccessLog]) -> StdoutAccessLog {
        let Some(access_log::ConfigType::TypedConfig(any)) = &logs[0].config_type else {
            panic!("a typed config");
        };
        StdoutAccessLog::decode(any.value.as_slice()).expect("a StdoutAccessLog")
    }

    #[test]
    fn json_by_default_with_every_field_and_the_same_bytes_every_time() {
        let logs = access_logs(&model::AccessLog::default());
        assert_eq!(logs.len(), 1);
        assert!(logs[0].filter.is_none(), "every request");
        let Some(stdout_access_log::AccessLogFormat::LogFormat(format)) =
            decoded(&logs).access_log_format
        else {
            panic!("a log format");
        };
        let Some(
            envoy_types::pb::envoy::config::core::v3::substitution_format_string::Format::JsonFormat(
                json,
            ),
        ) = format.format
        else {
            panic!("a JSON format");
        };
        assert_eq!(json.fields.len(), JSON_FIELDS.len());
        assert!(JSON_FIELDS.is_sorted_by_key(|(name, _)| *name));
        assert!(CONNECTION_JSON_FIELDS.is_sorted_by_key(|(name, _)| *name));
        for _ in 0..10 {
            assert_eq!(access_logs(&model::AccessLog::default()), logs);
        }
    }

    #[test]
    fn text_off_and_sampled() {
        let text = model::AccessLog {
            format: AccessLogFormat::Text,
            sample_percent: 100,
        };
        assert_eq!(decoded(&access_logs(&text)), StdoutAccessLog::default());
        let off = model::AccessLog {
            format: AccessLogFormat::Off,
            sample_percent: 100,
        };
        assert!(access_logs(&off).is_empty());
        let sampled = model::AccessLog {
            format: AccessLogFormat::Json,
            sample_percent: 10,
        };
        let logs = access_logs(&sampled);
        let Some(access_log_filter::FilterSpecifier::RuntimeFilter(runtime)) = logs[0]
            .filter
            .as_ref()
            .and_then(|f| f.filter_specifier.clone())
        else {
            panic!("a runtime filter");
        };
        assert_eq!(runtime.percent_sampled.map(|p| p.numerator), Some(10));
    }
}
