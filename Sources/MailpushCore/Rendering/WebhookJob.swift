extension JobRenderer {
    /// The `webhook` object of a job for a com method 3 (sponsor) device: nothing is sealed.
    func writeWebhook(sponseeDetails: String, event: EmailReceived, to w: inout JSONWriter) throws(RenderError) {
        guard let url = options.sponsorWebhookURL else { throw .noSponsorWebhook }
        w.key("webhook")
        w.beginObject()
        w.field("url", url)
        w.key("body")
        w.beginObject()
        w.field("msgId", event.messageId)
        w.field("sponseeDetails", sponseeDetails)
        w.key("metaData")
        w.beginObject()
        w.field("msgType", EmailReceived.messageReceivedType)
        w.endObject()
        w.endObject()
        w.endObject()
    }
}
