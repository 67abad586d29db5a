/*
 * Example EIE policy plugin: evicts the largest idle model first (the generic strategy evicts
 * the least recently used), and refuses to load any model whose name starts with the prefix
 * given as {"deny_prefix": "..."} in policy.plugin_options.
 *
 * Build: cc -shared -fPIC -I native/include -o largest_first.so native/examples/largest_first.c
 */
#include <string.h>

#include "eie_policy.h"

static char deny_prefix[128];

static int init(const char *options_json) {
    const char *key = strstr(options_json, "\"deny_prefix\"");
    deny_prefix[0] = '\0';
    if (!key) {
        return 0;
    }
    const char *start = strchr(key + 13, '"');
    if (!start) {
        return 1;
    }
    const char *end = strchr(start + 1, '"');
    size_t len = end ? (size_t)(end - start - 1) : 0;
    if (!end || len >= sizeof deny_prefix) {
        return 1;
    }
    memcpy(deny_prefix, start + 1, len);
    deny_prefix[len] = '\0';
    return 0;
}

static int on_request(const char *model) {
    size_t n = strlen(deny_prefix);
    return n > 0 && strncmp(model, deny_prefix, n) == 0;
}

static int choose_eviction(const eie_model_info *models, size_t n, const char *for_model) {
    (void)for_model;
    int best = -1;
    for (size_t i = 0; i < n; i++) {
        if (best < 0 || models[i].bytes > models[best].bytes) {
            best = (int)i;
        }
    }
    return best;
}

static const eie_policy policy = {
    EIE_POLICY_ABI_VERSION, "largest-first", init, on_request, NULL, choose_eviction, NULL,
};

const eie_policy *eie_policy_get(void) { return &policy; }
