print("mailpush")
