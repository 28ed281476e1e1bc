"""Every message a client can read, in Chinese, specific enough to act on (contract.md § Envelope).

The field refusals' texts are the fields' own (`shared.contract.refusals`); these are the
rest: the gateway's, the GPU host's and the analysis', each with the code it comes with.
"""

# Infrastructure failures reuse 1007 with these exact messages (contract.md).
MSG_BACKEND_UNAVAILABLE = "后端服务暂不可用，请稍后重试"
MSG_BACKEND_BUSY = "后端服务繁忙，请稍后重试"
# A GPU host's model child timed out or died mid-request (1007); it is being replaced.
MSG_INFERENCE_TIMED_OUT = "推理超时（超过 {seconds:g} 秒），模型进程已重启，请稍后重试"
MSG_MODEL_PROCESS_DIED = "模型进程异常退出，正在重启，请稍后重试"
# A GPU host's deadline (X-Request-Timeout-Ms, gpu_host.md § Deadlines and departures), 1007:
# too little time left to start, or the time ran out (the model child is not restarted for it).
MSG_DEADLINE_TOO_SHORT = "剩余处理时限不足（{ms} 毫秒），未开始处理，请稍后重试"
MSG_DEADLINE_EXCEEDED = "处理超出请求时限（{seconds:g} 秒），请稍后重试"
# A GPU host's model child hit a CUDA failure (1007, `cuda_oom` / `cuda_error`), or is not loaded.
MSG_CUDA_OOM = "GPU 显存不足，请稍后重试"
MSG_CUDA_ERROR = "GPU 运行异常，请稍后重试"
MSG_MODEL_LOAD_FAILED = "模型加载失败，需运维处理，请稍后重试"
# A GPU host's /health while a filesystem it writes to is below gpu_host.min_free_disk_mb.
MSG_DISK_LOW = "磁盘空间不足：剩余 {free_mb} MB，至少需要 {needed_mb} MB"
# A body over the service's limit (1003), from the gateway or a GPU host.
MSG_BODY_TOO_LARGE = "请求体过大：上限 {limit_bytes} 字节"
# An image over analysis.max_image_bytes (1003), whichever check (upload or decode) sees it.
MSG_IMAGE_TOO_LARGE = "图片过大：{size_mb:.1f} MB，最多允许 {limit_mb:.1f} MB，请压缩后上传"
# The pictures one answer would draw exceed analysis.max_answer_megapixels (1004): refused
# before any is drawn, saying how many at which size and what to change.
MSG_ANSWER_TOO_LARGE = (
    "本次请求需生成 {count} 张 {width}×{height} 的图片（共 {megapixels:.1f} 百万像素），"
    "超过上限 {limit:g} 百万像素：请缩小照片，或减少 plans / styles 后重试"
)
# Not a JPEG, PNG or WebP by its magic bytes or its header (1002): gateway, host and child alike.
MSG_UNSUPPORTED_IMAGE_FORMAT = "图片格式不支持：请上传 JPEG、PNG 或 WebP 格式的图片"
# A GPU host already running a job answers any other business request at once with HTTP
# 503 and this 1007 plus `"busy": true` (gateway.md § Several gateways): it never queues.
# Only gateways read it; they send the request elsewhere and never show it to a client.
MSG_HOST_BUSY = "GPU 主机正在处理另一个请求（主机不排队），请改投其他主机"
# Gateway answers for /api/ requests it cannot route.
MSG_UNKNOWN_ENDPOINT = "接口不存在：{method} {path}"
MSG_METHOD_NOT_ALLOWED = "接口 {path} 不接受 {method} 请求，只接受 {allowed}"
MSG_WEBSOCKET_NOT_SERVED = "接口不支持 WebSocket：请用 HTTP/1.1 请求调用"  # 1001, both services
# Requests that are not well-formed HTTP/1.1, answered by the server before any app (1001,
# both services; shared.http_server): each says what was malformed.
MSG_HTTP_MALFORMED = "请求不是合法的 HTTP/1.1：{detail}"
MSG_HTTP_CONFLICTING_LENGTHS = "请求格式错误：Content-Length 出现多次且取值不同，只能给一个"
MSG_HTTP_BAD_LENGTH = "请求格式错误：Content-Length 须是一个非负整数"
MSG_HTTP_LENGTH_AND_CHUNKED = "请求格式错误：Content-Length 与 Transfer-Encoding 不能同时出现，只用其一"
MSG_HTTP_TRANSFER_ENCODING = "请求格式错误：Transfer-Encoding 只支持 chunked（只能出现一次）"
MSG_HTTP_NO_HOST = "请求格式错误：缺少 Host 请求头"
MSG_HTTP_TWO_HOSTS = "请求格式错误：Host 请求头只能有一个"
MSG_HTTP_BAD_CHUNK = "请求格式错误：chunked 请求体的分块无效（每块以十六进制长度加 CRLF 开头，以 CRLF 结尾）"
MSG_HTTP_UNDECLARED_BODY = (
    "请求格式错误：请求体没有声明长度（HTTP/1.0 或 Connection: close 的请求带请求体时须有 Content-Length）"
)
MSG_HTTP_REQUEST_LINE = "请求格式错误：请求行须为「方法 路径 HTTP/1.1」"
# Requests the gateway refuses before reading or forwarding them (1001).
MSG_HEADERS_TOO_LARGE = "请求头过大：上限 {limit_bytes} 字节（含查询字符串）"
MSG_BODY_TOO_SLOW = "请求体接收超时：{seconds:g} 秒内未收完，请检查网络后重试"
# A GPU host refused the request itself (a 4xx other than 401): about the request, not the host.
MSG_REFUSED_BY_HOST = "后端拒绝了该请求（HTTP {status}），请检查请求头与参数"
# Admission at the gateway (gateway.md § Rate limiting, § Idempotency).
MSG_RATE_LIMITED = "请求过于频繁，请稍后重试"  # 1007, with Retry-After
MSG_IDEMPOTENCY_KEY_REUSED = "Idempotency-Key 已用于不同的请求"  # 1001
MSG_IDEMPOTENCY_KEY_INVALID = "Idempotency-Key 无效：须为 1–128 个可打印 ASCII 字符"  # 1001
# 1001 from mark: `drop_mm` needs a hairline to lower (no_hairline, occluded: the client draws one)
MSG_NO_HAIRLINE_TO_LOWER = (
    "未检测到可下移的发际线（状态：{status}），无法使用 drop_mm；请改用 hairline_points 标记发际线"
)

# Endpoint 4 (the gateway's vision LLM), 1007 with Retry-After.
MSG_FEATURES_NOT_CONFIGURED = "面部特征分析未配置"
MSG_FEATURES_UNAVAILABLE = "面部特征分析暂不可用，请稍后重试"
# A hairline note (measure, `hairline` status `uncertain`): the photo's top edge cuts the
# head, so what lies above the frame (hair or scalp) cannot be judged (analysis.md § Statuses and claims).
NOTE_TOP_OF_HEAD_CUT = "照片上边缘截去了头顶，看不到完整的发际线，位置不确定：请拍摄完整的头部"
