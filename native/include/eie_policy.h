/*
 * EIE policy plugin C ABI.
 *
 * A plugin is a shared library exporting `eie_policy_get`, which returns a pointer to a static
 * `eie_policy` whose `abi_version` equals EIE_POLICY_ABI_VERSION. EIE loads it with
 * `policy.strategy: plugin:/path/to/plugin.so`; any callback may be NULL (EIE then uses the
 * generic strategy's answer). A plugin that cannot be loaded, has another ABI version or whose
 * init fails stops the server at start-up with the reason.
 *
 * Callbacks run on EIE's threads, one at a time; strings are UTF-8 and live only during the call.
 */
#ifndef EIE_POLICY_H
#define EIE_POLICY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EIE_POLICY_ABI_VERSION 1

/* What a plugin sees of a resident, idle, evictable model. */
typedef struct eie_model_info {
    const char *name;
    int64_t     bytes;          /* measured memory of weights, KV cache and compute buffers */
    double      idle_seconds;   /* since its last request */
    const char *group;          /* its group, or NULL */
} eie_model_info;

enum eie_pressure { EIE_PRESSURE_LOW = 1, EIE_PRESSURE_CRITICAL = 2 };

typedef struct eie_policy {
    uint32_t    abi_version;    /* EIE_POLICY_ABI_VERSION */
    const char *name;

    /* Called once with the plugin options as a JSON object; non-zero refuses to start. */
    int  (*init)(const char *options_json);
    /* A request for `model` that is not loaded: 0 lets it load, non-zero refuses it. */
    int  (*on_request)(const char *model);
    /* Memory crossed the low watermark; `models` are the idle, evictable ones. Return how many
       EIE may evict (each chosen by choose_eviction), or -1 for as many as it takes. */
    int  (*on_memory_pressure)(int level, const eie_model_info *models, size_t n);
    /* Which of `models` to evict to make room for `for_model`: an index, or -1 for none. */
    int  (*choose_eviction)(const eie_model_info *models, size_t n, const char *for_model);
    void (*shutdown)(void);
} eie_policy;

const eie_policy *eie_policy_get(void);

#ifdef __cplusplus
}
#endif

#endif /* EIE_POLICY_H */
