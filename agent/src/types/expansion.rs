//! `$(VAR)` expansion in container commands, arguments and environment values (upstream
//! `third_party/forked/golang/expansion`, used by the kubelet for `command`, `args`,
//! `env[].value`, exec probe and hook commands and `subPathExpr`).

use std::collections::HashMap;

/// Expands `$(NAME)` references; `$$` escapes a `$`; unknown references stay as written.
#[must_use]
pub fn expand<S: std::hash::BuildHasher>(input: &str, vars: &HashMap<&str, &str, S>) -> String {
    let mut out = String::with_capacity(input.len());
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            if bytes[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if bytes[i + 1] == b'('
                && let Some(end) = input[i + 2..].find(')')
            {
                let name = &input[i + 2..i + 2 + end];
                match vars.get(name) {
                    Some(v) => out.push_str(v),
                    None => {
                        out.push_str(&input[i..i + 3 + end]);
                    }
                }
                i += 3 + end;
                continue;
            }
        }
        let ch = input[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion() {
        let vars = HashMap::from([("A", "1"), ("B", "two")]);
        assert_eq!(expand("x$(A)y$(B)", &vars), "x1ytwo");
        assert_eq!(expand("$(C) $$(A) $", &vars), "$(C) $(A) $");
        assert_eq!(expand("é$(A", &vars), "é$(A");
    }
}
