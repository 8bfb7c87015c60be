# shellcheck shell=bash
# Sourced by the scripts that print URLs: the shell twin of src/redact.rs.
# A URL's password (everything between the first ':' after scheme:// and the
# last '@' of the authority) and the values of secret query parameters are
# replaced by ***, also when the URL would not parse.

# redact_url URL -> URL without its secrets, on stdout
redact_url() {
    local url=$1 scheme rest userinfo after host tail
    if [[ $url != *://* ]]; then
        printf '%s\n' "$url"
        return
    fi
    scheme=${url%%://*}
    rest=${url#*://}
    if [[ $rest == *@* ]]; then
        userinfo=${rest%@*}
        after=${rest##*@}
        host=${after%%[/?#]*}
        tail=${after:${#host}}
        # why: a user without a password has nothing to hide
        [[ $userinfo == *:* ]] && userinfo="${userinfo%%:*}:***"
        rest="$userinfo@$host$tail"
    fi
    printf '%s://%s\n' "$scheme" "$rest" |
        sed -E 's/([?&](password|pass|passwd|secret|token|sslpassword)=)[^&#]*/\1***/Ig'
}
