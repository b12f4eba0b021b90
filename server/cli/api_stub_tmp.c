/* TEMPORARY (delete when server/http/api.c is on main): tv__api_* stubs so
 * the CLI links; local mode through the api answers "not supported" until
 * then. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/api_seam.h"
#include "util/internal.h"

#ifdef TV__CLI_API_STUBBED
int tv__api_open(const tv__api_opts *o, tv__store *writer, tv__api **out, tv_error *err)
{
    (void)writer;
    *out = NULL;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "store '%s': the in-process api is not built yet",
                      o && o->store_dir ? o->store_dir : "");
}

void tv__api_close(tv__api *api)
{
    (void)api;
}

json_t *tv__api_error_json(int code, const char *message)
{
    return json_pack("{s:{s:s,s:s,s:i}}", "error", "code", tv_err_name(code), "message",
                     message ? message : "", "errno", code);
}

int tv__api_handle(tv__api *api, const tv__api_req *req, tv__api_resp *resp)
{
    (void)api;
    (void)req;
    memset(resp, 0, sizeof(*resp));
    resp->status = 500;
    resp->content_type = "application/json";
    resp->json = tv__api_error_json(TV_E_NOT_SUPPORTED, "the in-process api is not built yet");
    return 0;
}

ssize_t tv__api_stream_read(tv__api_resp *resp, uint64_t pos, void *buf, size_t max)
{
    (void)resp;
    (void)pos;
    (void)buf;
    (void)max;
    return -ENOSYS;
}

void tv__api_resp_free(tv__api_resp *resp)
{
    if (!resp)
        return;
    free(resp->body);
    resp->body = NULL;
    json_decref(resp->json);
    resp->json = NULL;
}
#endif
