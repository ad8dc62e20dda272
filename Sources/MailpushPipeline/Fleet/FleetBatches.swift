import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

/// A batch's state records, one per event partition it read, without their marks, and each encoded as the state
/// directory keeps it until the state topic acknowledges it (`UnwrittenStateRecord`).
struct BatchStateRecords: Sendable {
    var records: [PartitionStateRecord]
    var values: [(partition: TopicPartition, value: [UInt8])]
}

extension Fleet {
    /// A batch's records (offsets, dedupe entries), made while its outputs are acknowledged, before its commit, and
    /// without marks: theirs are the ones the commit leaves (a later batch's marks may lie past outputs that a new
    /// owner, restoring only this record, must read back), encoded inside it once for all the batch's records and
    /// written with them (`BatchStatePublisher.submit`).
    func batchStateRecords(
        previous: [TopicPartition: Int64], offsets: [TopicPartition: Int64], batch: ProcessedBatch, processedAtMs: Int64
    ) -> BatchStateRecords {
        var emails: [Int32: [String]] = [:]
        for (email, partition) in zip(batch.processedEmails, batch.processedEmailPartitions) {
            emails[partition, default: []].append(email)
        }
        var records: [PartitionStateRecord] = []
        for (eventPartition, offset) in offsets.sorted(by: { $0.key < $1.key }) {
            guard let epoch = leases.epoch(of: eventPartition.partition), let from = previous[eventPartition] else { continue }
            records.append(
                PartitionStateRecord.batch(
                    topic: eventPartition.topic, partition: eventPartition.partition, epoch: epoch, owner: instanceId,
                    from: from, offset: offset, marks: [:], processedAtMs: processedAtMs, emails: emails[eventPartition.partition] ?? []))
        }
        return BatchStateRecords(records: records, values: PartitionStateRecord.unwrittenValues(records))
    }
}

extension OwnedPartitions {
    /// Starts writing a committed batch's state records, while the next batch is delivered: they take a
    /// produce round trip per partition, which would otherwise stand between every two batches.
    /// `marksJSON`: their marks as the commit encoded them; `batch`: the id the commit stored them under
    /// (`unwritten_state_batch`).
    func publishBatchState(_ records: [PartitionStateRecord], marksJSON: [UInt8]? = nil, stored batch: Int64?) {
        fleet?.statePublisher.submit(records, marksJSON: marksJSON, stored: batch)
    }

    /// Waits until the batch records submitted have been written (or given up on): before anything that must
    /// follow them in the state topic (a release, a claim, leaving the group, giving a partition up).
    func settleStatePublish() async {
        await fleet?.statePublisher.settle()
    }
}
