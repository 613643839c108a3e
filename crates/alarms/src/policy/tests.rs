//! The `WORKFLOWS_*` settings read from a lookup.

use std::collections::BTreeMap;

use super::*;

fn from(vars: &[(&str, &str)]) -> DispatcherConfig {
    let vars: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    DispatcherConfig::from_lookup(|k| vars.get(k).cloned())
}

#[test]
fn unset_variables_give_the_defaults() {
    assert_eq!(from(&[]), DispatcherConfig::default());
}

#[test]
fn every_variable_is_read() {
    let config = from(&[
        (ENV_RETRY_DELAY_MS, "250"),
        (ENV_RETRY_MAX_DELAY_MS, "30000"),
        (ENV_RETRY_JITTER, "0.5"),
        (ENV_RETRY_MAX_TRIES, "3"),
        (ENV_CLAIM_LEASE_MS, "45000"),
        (ENV_DISPATCH_TIMEOUT_MS, "9000"),
    ]);
    assert_eq!(
        config.retry,
        RetryPolicy {
            base_delay_ms: 250,
            max_delay_ms: 30_000,
            jitter: 0.5,
            max_tries: 3,
        }
    );
    assert_eq!(config.claim_lease_ms, 45_000);
    assert_eq!(config.dispatch_timeout_ms, 9_000);
    assert!(config.validate().is_ok());
}

#[test]
fn invalid_values_fall_back_to_their_defaults() {
    let defaults = DispatcherConfig::default();
    for bad in [
        "",
        "0",
        "-5",
        "012",
        "1e3",
        "abc",
        " 5",
        "2147483648",
        "99999999999999999",
    ] {
        let config = from(&[
            (ENV_RETRY_DELAY_MS, bad),
            (ENV_RETRY_MAX_DELAY_MS, bad),
            (ENV_RETRY_MAX_TRIES, bad),
            (ENV_CLAIM_LEASE_MS, bad),
            (ENV_DISPATCH_TIMEOUT_MS, bad),
        ]);
        assert_eq!(config, defaults, "value {bad:?}");
    }
    for bad in ["", "1.5", "-0.1", "NaN", "inf", "0x1", "1e-1", " 0.2"] {
        let config = from(&[(ENV_RETRY_JITTER, bad)]);
        assert_eq!(config.retry.jitter, DEFAULT_RETRY_JITTER, "jitter {bad:?}");
    }
    assert_eq!(from(&[(ENV_RETRY_JITTER, "0")]).retry.jitter, 0.0);
    assert_eq!(from(&[(ENV_RETRY_JITTER, "1")]).retry.jitter, 1.0);
}

#[test]
fn a_cap_below_the_first_delay_is_raised_to_it_and_the_result_validates() {
    let config = from(&[
        (ENV_RETRY_DELAY_MS, "5000"),
        (ENV_RETRY_MAX_DELAY_MS, "100"),
    ]);
    assert_eq!(config.retry.base_delay_ms, 5_000);
    assert_eq!(config.retry.max_delay_ms, 5_000);
    assert!(config.validate().is_ok());
    // The largest values still validate: the dispatch timeout stays below
    // 2^31-1 and the effective lease above it.
    let max = MAX_DELAY_MS.to_string();
    let config = from(&[
        (ENV_DISPATCH_TIMEOUT_MS, max.as_str()),
        (ENV_CLAIM_LEASE_MS, "1"),
    ]);
    assert!(config.validate().is_ok());
    assert!(config.effective_lease_ms() > config.dispatch_timeout_ms);
}
