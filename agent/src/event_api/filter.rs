//! Server-side filtering of `Watch` streams: which events a `WatchRequest` selects, and
//! which requests are malformed. Pure functions, so the rules are tested without a
//! socket.

use tonic::Status;

use super::{NodeEvent, proto};

/// Rejects a request that could never match what the client meant: a kind that is
/// `EVENT_KIND_UNSPECIFIED` or newer than this agent. Silently ignoring such a value
/// would either drop the filter (flooding the client) or match nothing (starving it).
pub fn validate(req: &proto::WatchRequest) -> Result<(), Status> {
    for &kind in &req.kinds {
        match proto::EventKind::try_from(kind) {
            Ok(proto::EventKind::Unspecified) => {
                return Err(Status::invalid_argument("kinds: EVENT_KIND_UNSPECIFIED is not a filter value"));
            }
            Ok(_) => {}
            Err(_) => return Err(Status::invalid_argument(format!("kinds: unknown event kind {kind}"))),
        }
    }
    Ok(())
}

/// Whether `ev` is selected by `req`: an empty list does not filter, an event matches a
/// list when it equals any of its values, and it must match every list. The agent's
/// records ([`super::NodeEventKind::is_record`]) match only a `kinds` list that names them. Matching is
/// exact and case-sensitive, as Kubernetes names and UIDs are.
#[must_use]
pub fn matches(req: &proto::WatchRequest, ev: &NodeEvent) -> bool {
    fn any_of(list: &[String], value: &str) -> bool {
        list.is_empty() || list.iter().any(|v| v == value)
    }
    any_of(&req.namespaces, &ev.pod_namespace)
        && any_of(&req.pod_names, &ev.pod_name)
        && any_of(&req.pod_uids, &ev.pod_uid)
        && if req.kinds.is_empty() {
            !ev.kind.is_record()
        } else {
            req.kinds.contains(&i32::from(proto::EventKind::from(ev.kind)))
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_api::NodeEventKind;

    fn ev(ns: &str, name: &str, uid: &str, kind: NodeEventKind) -> NodeEvent {
        NodeEvent { pod_namespace: ns.into(), pod_name: name.into(), pod_uid: uid.into(), ..NodeEvent::new(kind) }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn empty_request_matches_everything() {
        let req = proto::WatchRequest::default();
        assert!(matches(&req, &ev("a", "p", "u", NodeEventKind::ContainerDied)));
        assert!(matches(&req, &NodeEvent::new(NodeEventKind::MemoryPressure)));
    }

    #[test]
    fn records_are_sent_only_when_asked_for_by_kind() {
        let record = ev("a", "p", "u", NodeEventKind::PodStatusComputed);
        assert!(!matches(&proto::WatchRequest::default(), &record), "an empty request gets no records");
        let req = proto::WatchRequest { pod_uids: vec!["u".into()], ..Default::default() };
        assert!(!matches(&req, &record), "nor does one that filters on other fields only");
        let req = proto::WatchRequest { kinds: vec![proto::EventKind::PodStatusComputed.into()], ..Default::default() };
        assert!(matches(&req, &record));
        assert!(!matches(&req, &ev("a", "p", "u", NodeEventKind::ContainerDied)));
    }

    #[test]
    fn values_within_a_list_are_ored() {
        let req = proto::WatchRequest { namespaces: strings(&["a", "b"]), ..Default::default() };
        assert!(matches(&req, &ev("a", "p", "u", NodeEventKind::ContainerStarted)));
        assert!(matches(&req, &ev("b", "p", "u", NodeEventKind::ContainerStarted)));
        assert!(!matches(&req, &ev("c", "p", "u", NodeEventKind::ContainerStarted)));
    }

    #[test]
    fn lists_are_anded() {
        let req = proto::WatchRequest {
            namespaces: strings(&["a"]),
            pod_names: strings(&["web"]),
            kinds: vec![proto::EventKind::ContainerDied.into(), proto::EventKind::ContainerOomKilled.into()],
            ..Default::default()
        };
        assert!(matches(&req, &ev("a", "web", "u1", NodeEventKind::ContainerDied)));
        assert!(matches(&req, &ev("a", "web", "u2", NodeEventKind::ContainerOomKilled)));
        assert!(!matches(&req, &ev("b", "web", "u1", NodeEventKind::ContainerDied)), "namespace");
        assert!(!matches(&req, &ev("a", "db", "u1", NodeEventKind::ContainerDied)), "name");
        assert!(!matches(&req, &ev("a", "web", "u1", NodeEventKind::ContainerStarted)), "kind");
    }

    #[test]
    fn uid_filter() {
        let req = proto::WatchRequest { pod_uids: strings(&["u1"]), ..Default::default() };
        assert!(matches(&req, &ev("a", "web", "u1", NodeEventKind::CgroupCreated)));
        assert!(!matches(&req, &ev("a", "web", "u2", NodeEventKind::CgroupCreated)));
    }

    #[test]
    fn node_level_events_only_match_without_pod_filters() {
        let node_pressure = NodeEvent::new(NodeEventKind::MemoryPressure);
        let by_ns = proto::WatchRequest { namespaces: strings(&["a"]), ..Default::default() };
        assert!(!matches(&by_ns, &node_pressure));
        let by_kind =
            proto::WatchRequest { kinds: vec![proto::EventKind::MemoryPressure.into()], ..Default::default() };
        assert!(matches(&by_kind, &node_pressure));
    }

    #[test]
    fn matching_is_case_sensitive() {
        let req = proto::WatchRequest { namespaces: strings(&["Default"]), ..Default::default() };
        assert!(!matches(&req, &ev("default", "p", "u", NodeEventKind::ContainerStarted)));
    }

    #[test]
    fn rejects_unspecified_and_unknown_kinds() {
        let ok = proto::WatchRequest { kinds: vec![proto::EventKind::CgroupRemoved.into()], ..Default::default() };
        assert!(validate(&ok).is_ok());
        assert!(validate(&proto::WatchRequest::default()).is_ok());

        let unspecified = proto::WatchRequest { kinds: vec![0], ..Default::default() };
        let status = validate(&unspecified).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("EVENT_KIND_UNSPECIFIED"), "{}", status.message());

        let unknown = proto::WatchRequest { kinds: vec![1, 99], ..Default::default() };
        let status = validate(&unknown).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("99"), "{}", status.message());
    }
}
