//! The endpoint grammar and the default allowlist.

use super::*;

#[test]
fn default_policy_accepts_loopback_and_private_addresses() {
    let p = EndpointPolicy::default();
    for ok in [
        "http://127.0.0.1:8788",
        "http://127.9.9.9:1",
        "http://10.0.0.7:8788/",
        "http://172.16.0.1:80",
        "http://172.31.255.255:80",
        "http://192.168.1.2:65535",
        "http://100.64.0.1:8788",
        "http://100.127.255.255:8788",
        "http://[::1]:8788",
        "http://[fd00::1]:8788",
    ] {
        let e = p.check(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        assert_eq!(e.url(), ok.trim_end_matches('/'));
    }
}

#[test]
fn the_derived_policy_is_loopback_and_private_on_the_internal_port_only() {
    let p = EndpointPolicy::internal_port(8788);
    assert_eq!(
        p,
        EndpointPolicy {
            loopback: true,
            private: true,
            hosts: Vec::new(),
            ports: Some(vec![8788]),
        }
    );
    for ok in [
        "http://127.0.0.1:8788",
        "http://10.0.0.7:8788",
        "http://[::1]:8788",
    ] {
        assert!(p.check(ok).is_ok(), "{ok}");
    }
    for bad in [
        "http://127.0.0.1:5432",
        "http://127.0.0.1:6379",
        "http://10.0.0.7:8789",
        "http://8.8.8.8:8788",
        "http://do.internal:8788",
    ] {
        assert!(p.check(bad).is_err(), "{bad}");
    }
    let several = EndpointPolicy::ports([18788, 18789]);
    assert!(several.check("http://127.0.0.1:18789").is_ok());
    assert!(several.check("http://127.0.0.1:18790").is_err());
    let local = EndpointPolicy::loopback();
    assert!(local.check("http://127.0.0.1:40123").is_ok());
    assert!(local.check("http://10.0.0.7:8788").is_err());
}

#[test]
fn hostile_endpoints_are_refused() {
    let p = EndpointPolicy::default();
    for bad in [
        "",
        "http://8.8.8.8:80",
        "http://172.32.0.1:80",
        "http://172.15.0.1:80",
        "http://100.128.0.1:80",
        "http://169.254.169.254:80",
        "http://0.0.0.0:80",
        "http://[::ffff:8.8.8.8]:80",
        "http://[2001:db8::1]:80",
        "https://10.0.0.1:443",
        "http://10.0.0.1",
        "http://10.0.0.1:",
        "http://10.0.0.1:0",
        "http://10.0.0.1:08788",
        "http://10.0.0.1:65536",
        "http://user:pw@10.0.0.1:80",
        "http://10.0.0.1:80/path",
        "http://10.0.0.1:80?q",
        "http://10.0.0.1:80#f",
        "http://10.0.0.1:80/%2e",
        "http://127.1:80",
        "http://0127.0.0.1:80",
        "http://localhost:8788",
        "http://evil.example:80",
        "http://10.0.0.1 :80",
        "http://10.0.0.1:80\n",
        "HTTP://10.0.0.1:80",
    ] {
        assert!(p.check(bad).is_err(), "{bad:?} should be refused");
    }
    let long = format!("http://{}:80", "a".repeat(MAX_ENDPOINT_BYTES));
    assert!(p.check(&long).is_err());
}

#[test]
fn policies_narrow_and_widen() {
    let only_private = EndpointPolicy {
        loopback: false,
        ..EndpointPolicy::default()
    };
    assert!(only_private.check("http://127.0.0.1:80").is_err());
    assert!(only_private.check("http://10.1.2.3:80").is_ok());
    let ports = EndpointPolicy {
        ports: Some(vec![8788]),
        ..EndpointPolicy::default()
    };
    assert!(ports.check("http://10.1.2.3:8788").is_ok());
    assert!(ports.check("http://10.1.2.3:8789").is_err());
    let named = EndpointPolicy {
        hosts: vec!["do-runtime.internal".to_owned()],
        ..EndpointPolicy::default()
    };
    assert!(named.check("http://do-runtime.internal:8788").is_ok());
    assert!(named.check("http://do-runtime.internal.evil:8788").is_err());
}
